/* RWKV-4's decoding step (one token of one sequence) in one call: the CPU path of models/rwkv4/step.py.
 * What every model's step shares (threads, matrix products, norms, the weights as stored) is models/native/steps.h,
 * whose opening says why the steps are C, how their threads and weights work. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "steps.h"
#include "rwkv4_step.h"

/* ----------------------------------------------------------------------------------------------- RWKV-4 */

/* Weights (weights.h): pre_ln's (R4_HEAD), then R4_WEIGHTS per block (transformers' RwkvForCausalLM names), then
 * ln_out's */
_Static_assert(R4_HEAD_PRE_LN_W == 0 && R4_HEAD_PRE_LN_B == 1, "embed_normed reads pre_ln as weights 0 and 1");

struct rwkv4_job {
    int64_t C, A, F, L, rescale_every, bf16;
    float eps;
    const void *const *weights;      /* R4_HEAD (pre_ln), R4_WEIGHTS per block, then the tail (ln_out) */
    const int64_t *transposed;       /* per weight: stored as its transpose (see matvec) */
    const int64_t *weight_bf16;      /* per weight: bf16 (else fp32) */
    const void *embedding;           /* the token's row */
    const float *const *state_in;    /* ffn_x_prev, att_x_prev, att_num, att_den, att_max: (1, C or A, L) each */
    float *const *state_out;
    float *hidden;                   /* out: ln_out's output (C) */
    struct scratch s;
};

/* A thread's view of an RWKV-4 step's scratch: the vectors all threads share (the residual stream x, the
 * projections, the WKV output, the products' outputs) and its own (the normed input, the mixes, the WKV loop's
 * inputs and state), and its share of the channels (c0 .. c1), of the attention channels (a0 .. a1: whole blocks of
 * the WKV loop) and of the feed-forward rows (f0 .. f1). */
struct rwkv4_thread {
    float *x, *k, *v, *r, *wkv, *kf, *rf, *o;
    float *xn, *xk, *xv, *xr, *w, *u, *num0, *den0, *max0, *num, *den, *mx, *lag;
    int32_t *bad;
    int64_t c0, c1, a0, a1, f0, f1;
};

static struct rwkv4_thread rwkv4_thread_scratch(const struct rwkv4_job *j, int64_t id, int64_t threads)
{
    const int64_t C = j->C, A = j->A, F = j->F;
    struct rwkv4_thread b;
    b.x = j->s.shared, b.k = b.x + C, b.v = b.k + A, b.r = b.v + A, b.wkv = b.r + A, b.kf = b.wkv + A;
    b.rf = b.kf + F, b.o = b.rf + C;
    b.xn = j->s.own + id * j->s.own_size, b.xk = b.xn + C, b.xv = b.xk + C, b.xr = b.xv + C;
    b.w = b.xr + C, b.u = b.w + A, b.num0 = b.u + A, b.den0 = b.num0 + A, b.max0 = b.den0 + A, b.num = b.max0 + A;
    b.den = b.num + A, b.mx = b.den + A, b.lag = b.mx + A;
    b.bad = (int32_t *)(b.lag + A);
    share(C, 1, id, threads, &b.c0, &b.c1);
    share(A, 16, id, threads, &b.a0, &b.a1);       /* whole blocks of the WKV loop */
    share(F, 1, id, threads, &b.f0, &b.f1);
    return b;
}

/* A block's time mix: r, k, v from lerp(x_{t-1}, x_t, mu); WKV-4 over this thread's channels; x += W_o (sigmoid(r)
 * wkv). p, t, f: the block's weights, whether each is stored transposed, whether each is bf16; scale: the rescaling
 * of this block's outputs (2^-(layer / rescale_every)). */
static void rwkv4_step_time_mix(const struct rwkv4_job *j, const struct rwkv4_thread *b, int64_t layer,
                                const void *const *p, const int64_t *t, const int64_t *f, float scale)
{
    const int64_t C = j->C, A = j->A, L = j->L, c0 = b->c0, c1 = b->c1, a0 = b->a0, a1 = b->a1;
    float *x = b->x, *xn = b->xn, *xk = b->xk, *xv = b->xv, *xr = b->xr, *wkv = b->wkv;
    layer_norm(C, x, p[R4_LN1_W], f[R4_LN1_W], p[R4_LN1_B], f[R4_LN1_B], j->eps, xn);
    for (int64_t i = 0; i < C; i++) {
        const float prev = j->state_in[1][i * L + layer], d = xn[i] - prev;
        xk[i] = prev + at(p[R4_MIX_K], i, f[R4_MIX_K]) * d;
        xv[i] = prev + at(p[R4_MIX_V], i, f[R4_MIX_V]) * d;
        xr[i] = prev + at(p[R4_MIX_R], i, f[R4_MIX_R]) * d;
    }
    for (int64_t i = c0; i < c1; i++)
        j->state_out[1][i * L + layer] = xn[i];
    matvec(p[R4_KEY], t[R4_KEY], f[R4_KEY], NULL, 0, A, C, xk, 1.0f, b->k, a0, a1);
    matvec(p[R4_VALUE], t[R4_VALUE], f[R4_VALUE], NULL, 0, A, C, xv, 1.0f, b->v, a0, a1);
    matvec(p[R4_RECEPTANCE], t[R4_RECEPTANCE], f[R4_RECEPTANCE], NULL, 0, A, C, xr, 1.0f, b->r, a0, a1);
    for (int64_t i = a0; i < a1; i++) {
        b->w[i] = -exp_nan(at(p[R4_DECAY], i, f[R4_DECAY]));
        b->u[i] = at(p[R4_FIRST], i, f[R4_FIRST]);
        b->num0[i] = j->state_in[2][i * L + layer];
        b->den0[i] = j->state_in[3][i * L + layer];
        b->max0[i] = j->state_in[4][i * L + layer];
    }
    /* (wkv4_forward and selective_scan_forward allocate nothing and take any size: their status is STATUS_OK) */
    wkv4_forward(a0 / 16, (a1 + 15) / 16, 1, A, 16, b->w, b->u, b->k, b->v, wkv, b->num0, b->den0, b->max0, b->num,
                 b->den, b->mx, b->lag, b->bad, NULL, NULL, NULL);
    for (int64_t i = a0; i < a1; i++) {
        j->state_out[2][i * L + layer] = b->num[i];
        j->state_out[3][i * L + layer] = b->den[i];
        j->state_out[4][i * L + layer] = b->mx[i];
        wkv[i] *= sigmoid(b->r[i]) * scale;
    }
    BARRIER();
    add_matvec(p[R4_OUTPUT], t[R4_OUTPUT], f[R4_OUTPUT], NULL, 0, C, A, wkv, b->o, x, c0, c1);
    BARRIER();
}

/* A block's channel mix: x += sigmoid(r) * W_v relu(k)^2 (r, k from lerp(x_{t-1}, x_t, mu)), halved after every
 * rescale_every-th block; the arguments as rwkv4_step_time_mix's. */
static void rwkv4_step_channel_mix(const struct rwkv4_job *j, const struct rwkv4_thread *b, int64_t layer,
                                   const void *const *p, const int64_t *t, const int64_t *f, float scale)
{
    const int64_t C = j->C, F = j->F, L = j->L, c0 = b->c0, c1 = b->c1, f0 = b->f0, f1 = b->f1;
    float *x = b->x, *xn = b->xn, *xk = b->xk, *xr = b->xr, *kf = b->kf, *rf = b->rf, *o = b->o;
    layer_norm(C, x, p[R4_LN2_W], f[R4_LN2_W], p[R4_LN2_B], f[R4_LN2_B], j->eps, xn);
    for (int64_t i = 0; i < C; i++) {
        const float prev = j->state_in[0][i * L + layer], d = xn[i] - prev;
        xk[i] = prev + at(p[R4_FFN_MIX_K], i, f[R4_FFN_MIX_K]) * d;
        xr[i] = prev + at(p[R4_FFN_MIX_R], i, f[R4_FFN_MIX_R]) * d;
    }
    for (int64_t i = c0; i < c1; i++)
        j->state_out[0][i * L + layer] = xn[i];
    matvec(p[R4_FFN_KEY], t[R4_FFN_KEY], f[R4_FFN_KEY], NULL, 0, F, C, xk, 1.0f, kf, f0, f1);
    for (int64_t i = f0; i < f1; i++)
        kf[i] = relu(kf[i]) * kf[i] * scale;
    matvec(p[R4_FFN_RECEPTANCE], t[R4_FFN_RECEPTANCE], f[R4_FFN_RECEPTANCE], NULL, 0, C, C, xr, 1.0f, rf, c0, c1);
    BARRIER();
    matvec(p[R4_FFN_VALUE], t[R4_FFN_VALUE], f[R4_FFN_VALUE], NULL, 0, C, F, kf, 1.0f, o, c0, c1);
    const int halve = j->rescale_every > 0 && (layer + 1) % j->rescale_every == 0;
    for (int64_t i = c0; i < c1; i++) {
        x[i] += sigmoid(rf[i]) * o[i];
        x[i] = halve ? x[i] * 0.5f : x[i];
    }
    BARRIER();
}

static void rwkv4_run(void *arg, int64_t id, int64_t threads)
{
    struct rwkv4_job *j = arg;
    const struct rwkv4_thread b = rwkv4_thread_scratch(j, id, threads);
    const void *const *wt = j->weights;
    if (id == 0)
        embed_normed(j->C, j->embedding, j->bf16, wt, j->weight_bf16, j->eps, b.xn, b.x);
    BARRIER();
    for (int64_t layer = 0; layer < j->L; layer++) {
        const int64_t first = R4_HEAD + layer * R4_WEIGHTS;
        const void *const *p = wt + first;
        const int64_t *t = j->transposed + first, *f = j->weight_bf16 + first;
        const float scale = j->rescale_every > 0 ? ldexpf(1.0f, (int)-(layer / j->rescale_every)) : 1.0f;
        rwkv4_step_time_mix(j, &b, layer, p, t, f, scale);
        rwkv4_step_channel_mix(j, &b, layer, p, t, f, scale);
    }
    const int64_t tail = R4_HEAD + j->L * R4_WEIGHTS, lw = tail + R4_TAIL_LN_OUT_W, lb = tail + R4_TAIL_LN_OUT_B;
    if (id == 0)
        layer_norm(j->C, b.x, wt[lw], j->weight_bf16[lw], wt[lb], j->weight_bf16[lb], 1e-5f, j->hidden);
}

/* dims (weights.h's R4_DIM_*): C, A (attention size), F (feed-forward size), L, rescale_every, bf16 (the embedding's
 * dtype); eps: the blocks' layer norm eps (ln_out's is 1e-5, as in transformers). Returns a status. */
int rwkv4_decode(int64_t threads, const int64_t *dims, double eps, const void *const *weights,
                 const int64_t *transposed, const int64_t *weight_bf16, const void *embedding,
                 const float *const *state_in, float *const *state_out, float *hidden)
{
    struct rwkv4_job job = {dims[R4_DIM_C], dims[R4_DIM_A], dims[R4_DIM_F], dims[R4_DIM_L], dims[R4_DIM_RESCALE_EVERY],
                            dims[R4_DIM_BF16], (float)eps, weights, transposed,
                            weight_bf16, embedding, state_in, state_out, hidden, {0}};
    if (!scratch_alloc(&job.s, 3 * job.C + 4 * job.A + job.F, 4 * job.C + 10 * job.A, threads))
        return STATUS_NO_MEMORY;
    run_team(threads, rwkv4_run, &job);
    free(job.s.shared);
    return STATUS_OK;
}
