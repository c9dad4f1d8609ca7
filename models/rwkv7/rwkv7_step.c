/* RWKV-7's decoding step (one token of one sequence) in one call: the CPU path of models/rwkv7/step.py.
 * What every model's step shares (threads, matrix products, norms, the weights as stored) is models/native/steps.h,
 * whose opening says why the steps are C, how their threads and weights work. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "steps.h"
#include "rwkv7_step.h"

/* Items [first, last) of rwkv7_time_mix on one thread (rwkv7_time_mix.c); returns a status */
int time_mix_items(int64_t first, int64_t last, int64_t T, int64_t H, int64_t N, int64_t act_bf16,
                   const void *r, const void *k, const void *v, const void *v_first, const void *wl,
                   const void *al, const void *vl, const void *g, const void *const *params,
                   const int64_t *params_bf16, float group_eps, float *state, void *out);

/* ----------------------------------------------------------------------------------------------- RWKV-7 */

/* Weights (weights.h): ln0's (R7_HEAD), then R7_WEIGHTS per block (BlinkDL's names; W0 .. LN_X_B are
 * rwkv7_time_mix's params; V0, V1, V2 are NULL in block 0), then ln_out's */
_Static_assert(R7_LN_X_B - R7_W0 == MIX_PARAMS - 1, "rwkv7_time_mix reads W0 .. LN_X_B as its params");
_Static_assert(R7_HEAD_LN0_W == 0 && R7_HEAD_LN0_B == 1, "embed_normed reads ln0 as weights 0 and 1");

struct rwkv7_job {
    int64_t C, H, N, F, L, Dw, Da, Dv, Dg, bf16;
    float eps, group_eps;
    const void *const *weights;      /* R7_HEAD (ln0), R7_WEIGHTS per block, then the tail (ln_out) */
    const int64_t *transposed;       /* per weight: stored as its transpose (see matvec) */
    const int64_t *weight_bf16;      /* per weight: bf16 (else fp32) */
    const void *embedding;           /* the token's row */
    const void *const *state_in;     /* per block: att_x_prev (1, C) the embedding's dtype, att_kv (1, H, N, N) fp32,
                                        ffn_x_prev (1, C) the same */
    void *const *state_out;
    float *hidden;
    struct scratch s;
    int status;                      /* a thread's time mix's, where it failed */
};

/* A thread's view of an RWKV-7 step's scratch: the vectors all threads share (the residual stream x; r, k, v; the
 * LoRAs' outputs wl, al, vl, g and inner vectors hw, ha, hv, hg; the time mix's output y; v_first; the products'
 * outputs o, kf) and its own (the normed input, the six mixes), and its share of the heads (h0 .. h1, whole heads:
 * the per-head norms and the WKV loop), so of the channels (c0 .. c1), of the feed-forward rows (f0 .. f1) and of
 * each LoRA's inner rows (range: w, a, v, g). */
struct rwkv7_thread {
    float *x, *r, *k, *v, *wl, *al, *vl, *g, *y, *v_first, *o, *kf, *hw, *ha, *hv, *hg;
    float *xn, *xr, *xw, *xk, *xv, *xa, *xg;
    int64_t h0, h1, c0, c1, f0, f1, range[4][2];
};

static struct rwkv7_thread rwkv7_thread_scratch(const struct rwkv7_job *j, int64_t id, int64_t threads)
{
    const int64_t C = j->C, N = j->N, F = j->F;
    struct rwkv7_thread b;
    b.x = j->s.shared, b.r = b.x + C, b.k = b.r + C, b.v = b.k + C, b.wl = b.v + C, b.al = b.wl + C;
    b.vl = b.al + C, b.g = b.vl + C, b.y = b.g + C, b.v_first = b.y + C, b.o = b.v_first + C, b.kf = b.o + C;
    b.hw = b.kf + F, b.ha = b.hw + j->Dw, b.hv = b.ha + j->Da, b.hg = b.hv + j->Dv;
    b.xn = j->s.own + id * j->s.own_size, b.xr = b.xn + C, b.xw = b.xr + C, b.xk = b.xw + C, b.xv = b.xk + C;
    b.xa = b.xv + C, b.xg = b.xa + C;
    share(j->H, 1, id, threads, &b.h0, &b.h1);                 /* whole heads: the per-head norms and the WKV loop */
    b.c0 = b.h0 * N, b.c1 = b.h1 * N;
    share(F, 1, id, threads, &b.f0, &b.f1);
    const int64_t widths[4] = {j->Dw, j->Da, j->Dv, j->Dg};
    for (int64_t i = 0; i < 4; i++)
        share(widths[i], 1, id, threads, &b.range[i][0], &b.range[i][1]);
    return b;
}

/* A block's time mix: x + (x_{t-1} - x) mu for the six mixes; r, k, v for this thread's heads and the LoRAs'
 * inner products; then (after a barrier) this thread's heads: the LoRAs' outer products and rwkv7_time_mix's
 * loop; x += W_o y. p, t, f: the block's weights, whether each is stored transposed, whether each is bf16. */
static void rwkv7_step_time_mix(struct rwkv7_job *j, const struct rwkv7_thread *b, int64_t layer,
                                const void *const *p, const int64_t *t, const int64_t *f)
{
    const int64_t C = j->C, N = j->N, bf16 = j->bf16, c0 = b->c0, c1 = b->c1;
    const void *prev = j->state_in[3 * layer];
    float *xn = b->xn, *xv = b->xv, *hw = b->hw, *hg = b->hg, *v_first = b->v_first, *v = b->v;
    layer_norm(C, b->x, p[R7_LN1_W], f[R7_LN1_W], p[R7_LN1_B], f[R7_LN1_B], j->eps, xn);
    for (int64_t i = 0; i < C; i++) {
        const float d = at(prev, i, bf16) - xn[i];
        b->xr[i] = xn[i] + d * at(p[R7_X_R], i, f[R7_X_R]);
        b->xw[i] = xn[i] + d * at(p[R7_X_W], i, f[R7_X_W]);
        b->xk[i] = xn[i] + d * at(p[R7_X_K], i, f[R7_X_K]);
        xv[i] = xn[i] + d * at(p[R7_X_V], i, f[R7_X_V]);
        b->xa[i] = xn[i] + d * at(p[R7_X_A], i, f[R7_X_A]);
        b->xg[i] = xn[i] + d * at(p[R7_X_G], i, f[R7_X_G]);
    }
    for (int64_t i = c0; i < c1; i++)
        put(j->state_out[3 * layer], i, xn[i], bf16);
    matvec(p[R7_RECEPTANCE], t[R7_RECEPTANCE], f[R7_RECEPTANCE], NULL, 0, C, C, b->xr, 1.0f, b->r, c0, c1);
    matvec(p[R7_KEY], t[R7_KEY], f[R7_KEY], NULL, 0, C, C, b->xk, 1.0f, b->k, c0, c1);
    matvec(p[R7_VALUE], t[R7_VALUE], f[R7_VALUE], NULL, 0, C, C, xv, 1.0f, v, c0, c1);
    matvec(p[R7_W1], t[R7_W1], f[R7_W1], NULL, 0, j->Dw, C, b->xw, 1.0f, hw, b->range[0][0], b->range[0][1]);
    for (int64_t i = b->range[0][0]; i < b->range[0][1]; i++)
        hw[i] = 2.0f * sigmoid(2.0f * hw[i]) - 1.0f;                       /* tanh */
    matvec(p[R7_A1], t[R7_A1], f[R7_A1], NULL, 0, j->Da, C, b->xa, 1.0f, b->ha, b->range[1][0], b->range[1][1]);
    if (layer > 0)
        matvec(p[R7_V1], t[R7_V1], f[R7_V1], NULL, 0, j->Dv, C, xv, 1.0f, b->hv, b->range[2][0], b->range[2][1]);
    matvec(p[R7_G1], t[R7_G1], f[R7_G1], NULL, 0, j->Dg, C, b->xg, 1.0f, hg, b->range[3][0], b->range[3][1]);
    for (int64_t i = b->range[3][0]; i < b->range[3][1]; i++)
        hg[i] = sigmoid(hg[i]);
    BARRIER();
    /* this thread's heads: the LoRA outer products, then rwkv7_time_mix */
    matvec(p[R7_W2], t[R7_W2], f[R7_W2], NULL, 0, C, j->Dw, hw, 1.0f, b->wl, c0, c1);
    matvec(p[R7_A2], t[R7_A2], f[R7_A2], NULL, 0, C, j->Da, b->ha, 1.0f, b->al, c0, c1);
    matvec(p[R7_G2], t[R7_G2], f[R7_G2], NULL, 0, C, j->Dg, hg, 1.0f, b->g, c0, c1);
    if (layer == 0)
        memcpy(v_first + c0, v + c0, (c1 - c0) * sizeof(float));
    else
        matvec(p[R7_V2], t[R7_V2], f[R7_V2], NULL, 0, C, j->Dv, b->hv, 1.0f, b->vl, c0, c1);
    float *kv = j->state_out[3 * layer + 1];
    memcpy(kv + c0 * N, (const float *)j->state_in[3 * layer + 1] + c0 * N, (c1 - c0) * N * sizeof(float));
    const int status = time_mix_items(b->h0, b->h1, 1, j->H, N, 0, b->r, b->k, v, layer ? v_first : NULL, b->wl,
                                      b->al, layer ? b->vl : NULL, b->g, p + R7_W0, f + R7_W0, j->group_eps, kv, b->y);
    if (status)
        __atomic_store_n(&j->status, status, __ATOMIC_RELAXED);
    BARRIER();
    add_matvec(p[R7_OUTPUT], t[R7_OUTPUT], f[R7_OUTPUT], NULL, 0, C, C, b->y, b->o, b->x, c0, c1);
    BARRIER();
}

/* A block's channel mix: x += W_v relu(W_k (x + (x_{t-1} - x) mu))^2; the arguments as rwkv7_step_time_mix's. */
static void rwkv7_step_channel_mix(const struct rwkv7_job *j, const struct rwkv7_thread *b, int64_t layer,
                                   const void *const *p, const int64_t *t, const int64_t *f)
{
    const int64_t C = j->C, F = j->F, bf16 = j->bf16;
    const void *ffn_prev = j->state_in[3 * layer + 2];
    float *xn = b->xn, *xk = b->xk, *kf = b->kf;
    layer_norm(C, b->x, p[R7_LN2_W], f[R7_LN2_W], p[R7_LN2_B], f[R7_LN2_B], j->eps, xn);
    for (int64_t i = 0; i < C; i++)
        xk[i] = xn[i] + (at(ffn_prev, i, bf16) - xn[i]) * at(p[R7_FFN_X_K], i, f[R7_FFN_X_K]);
    for (int64_t i = b->c0; i < b->c1; i++)
        put(j->state_out[3 * layer + 2], i, xn[i], bf16);
    matvec(p[R7_FFN_KEY], t[R7_FFN_KEY], f[R7_FFN_KEY], NULL, 0, F, C, xk, 1.0f, kf, b->f0, b->f1);
    for (int64_t i = b->f0; i < b->f1; i++)
        kf[i] = relu(kf[i]) * kf[i];
    BARRIER();
    add_matvec(p[R7_FFN_VALUE], t[R7_FFN_VALUE], f[R7_FFN_VALUE], NULL, 0, C, F, kf, b->o, b->x, b->c0, b->c1);
    BARRIER();
}

static void rwkv7_run(void *arg, int64_t id, int64_t threads)
{
    struct rwkv7_job *j = arg;
    const struct rwkv7_thread b = rwkv7_thread_scratch(j, id, threads);
    const void *const *wt = j->weights;
    if (id == 0)
        embed_normed(j->C, j->embedding, j->bf16, wt, j->weight_bf16, j->eps, b.xn, b.x);
    BARRIER();
    for (int64_t layer = 0; layer < j->L; layer++) {
        const int64_t first = R7_HEAD + layer * R7_WEIGHTS;
        const void *const *p = wt + first;
        const int64_t *t = j->transposed + first, *f = j->weight_bf16 + first;
        rwkv7_step_time_mix(j, &b, layer, p, t, f);
        rwkv7_step_channel_mix(j, &b, layer, p, t, f);
    }
    const int64_t tail = R7_HEAD + j->L * R7_WEIGHTS, lw = tail + R7_TAIL_LN_OUT_W, lb = tail + R7_TAIL_LN_OUT_B;
    if (id == 0)
        layer_norm(j->C, b.x, wt[lw], j->weight_bf16[lw], wt[lb], j->weight_bf16[lb], j->eps, j->hidden);
}

/* dims (weights.h's R7_DIM_*): C, H, N, F, L, the LoRA widths Dw, Da, Dv, Dg, bf16 (the embedding's dtype, the
 * activations' and the x_prev states'); eps, group_eps: the layer norms' and the per-head group
 * norm's. Returns a status. */
int rwkv7_decode(int64_t threads, const int64_t *dims, double eps, double group_eps, const void *const *weights,
                 const int64_t *transposed, const int64_t *weight_bf16, const void *embedding,
                 const void *const *state_in, void *const *state_out, float *hidden)
{
    struct rwkv7_job job = {dims[R7_DIM_C], dims[R7_DIM_H], dims[R7_DIM_N], dims[R7_DIM_F], dims[R7_DIM_L],
                            dims[R7_DIM_DW], dims[R7_DIM_DA], dims[R7_DIM_DV], dims[R7_DIM_DG], dims[R7_DIM_BF16],
                            (float)eps, (float)group_eps, weights, transposed, weight_bf16, embedding, state_in,
                            state_out, hidden, {0}};
    const int64_t C = job.C, loras = job.Dw + job.Da + job.Dv + job.Dg;
    if (!scratch_alloc(&job.s, 11 * C + job.F + loras, 7 * C, threads))
        return STATUS_NO_MEMORY;
    run_team(threads, rwkv7_run, &job);
    free(job.s.shared);
    return job.status;
}
