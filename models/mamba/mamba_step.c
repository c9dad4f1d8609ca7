/* Mamba's decoding step (one token of one sequence) in one call: the CPU path of models/mamba/step.py.
 * What every model's step shares (threads, matrix products, norms, the weights as stored) is models/native/steps.h,
 * whose opening says why the steps are C, how their threads and weights work. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "steps.h"
#include "mamba_step.h"

/* ----------------------------------------------------------------------------------------------- Mamba */

/* Weights (weights.h): M_WEIGHTS per block (transformers' names; the biases may be NULL), then norm_f's */

struct mamba_job {
    int64_t C, D, N, K, R, L, bf16;
    float eps;
    const void *const *weights;      /* M_HEAD (none), M_WEIGHTS per block, then the tail (norm_f) */
    const int64_t *transposed;       /* per weight: stored as its transpose (see matvec) */
    const int64_t *weight_bf16;      /* per weight: bf16 (else fp32) */
    const void *embedding;
    const float *const *state_in;    /* per block: conv window (1, D, K - 1), h (1, D, N), fp32 */
    float *const *state_out;
    float *hidden;
    struct scratch s;
};

static void mamba_run(void *arg, int64_t id, int64_t threads)
{
    struct mamba_job *j = arg;
    const int64_t C = j->C, D = j->D, N = j->N, K = j->K, R = j->R, bf16 = j->bf16, lanes = selective_scan_lanes();
    float *x = j->s.shared, *xin = x + C, *z = xin + D, *u = z + D, *dbc = u + D, *delta = dbc + R + 2 * N;
    float *y = delta + D, *bias = y + D, *skip = bias + D, *o = skip + D, *A = o + C;
    float *xn = j->s.own + id * j->s.own_size;
    int64_t d0, d1, c0, c1, e0, e1;
    share(D, lanes, id, threads, &d0, &d1);              /* whole blocks of the scan's lanes */
    share(C, 1, id, threads, &c0, &c1);
    share(R + 2 * N, 1, id, threads, &e0, &e1);
    for (int64_t i = c0; i < c1; i++)
        x[i] = at(j->embedding, i, bf16);
    BARRIER();
    for (int64_t layer = 0; layer < j->L; layer++) {
        const int64_t first = M_HEAD + layer * M_WEIGHTS;
        const void *const *p = j->weights + first;
        const int64_t *t = j->transposed + first, *f = j->weight_bf16 + first;
        const float *window = j->state_in[2 * layer];
        float *window_out = j->state_out[2 * layer], *h = j->state_out[2 * layer + 1];
        /* x_in, z = in_proj(RMSNorm(x)); u = SiLU(the causal convolution over the window and x_in) */
        rms_norm(C, x, p[M_NORM], f[M_NORM], j->eps, xn);
        matvec(p[M_IN_PROJ], t[M_IN_PROJ], f[M_IN_PROJ], p[M_IN_PROJ_B], f[M_IN_PROJ_B], 2 * D, C, xn, 1.0f, xin,
               d0, d1);
        matvec(p[M_IN_PROJ], t[M_IN_PROJ], f[M_IN_PROJ], p[M_IN_PROJ_B], f[M_IN_PROJ_B], 2 * D, C, xn, 1.0f, xin,
               D + d0, D + d1);                                                                   /* z = xin + D */
        for (int64_t d = d0; d < d1; d++) {
            float sum = p[M_CONV_B] ? at(p[M_CONV_B], d, f[M_CONV_B]) : 0.0f;
            for (int64_t t = 0; t < K - 1; t++) {
                sum += window[d * (K - 1) + t] * at(p[M_CONV], d * K + t, f[M_CONV]);
                window_out[d * (K - 1) + t] = t + 1 < K - 1 ? window[d * (K - 1) + t + 1] : xin[d];
            }
            sum += xin[d] * at(p[M_CONV], d * K + K - 1, f[M_CONV]);
            u[d] = silu(sum);
        }
        BARRIER();
        /* dt_low, B, C = x_proj(u) */
        matvec(p[M_X_PROJ], t[M_X_PROJ], f[M_X_PROJ], NULL, 0, R + 2 * N, D, u, 1.0f, dbc, e0, e1);
        BARRIER();
        /* delta = dt_proj(dt_low) (its bias and softplus in the scan); the scan's step for this thread's channels */
        matvec(p[M_DT_PROJ], t[M_DT_PROJ], f[M_DT_PROJ], NULL, 0, D, R, dbc, 1.0f, delta, d0, d1);
        for (int64_t d = d0; d < d1; d++) {
            bias[d] = at(p[M_DT_PROJ_B], d, f[M_DT_PROJ_B]);
            skip[d] = at(p[M_D], d, f[M_D]);
            for (int64_t n = 0; n < N; n++)
                A[d * N + n] = -exp_nan(at(p[M_A_LOG], d * N + n, f[M_A_LOG]));
        }
        memcpy(h + d0 * N, j->state_in[2 * layer + 1] + d0 * N, (d1 - d0) * N * sizeof(float));
        selective_scan_forward(d0 / lanes, (d1 + lanes - 1) / lanes, D, 1, N, 1, u, delta, bias, A, dbc + R,
                               dbc + R + N, skip, z, y, h, 1, NULL, NULL);
        BARRIER();
        add_matvec(p[M_OUT_PROJ], t[M_OUT_PROJ], f[M_OUT_PROJ], p[M_OUT_PROJ_B], f[M_OUT_PROJ_B], C, D, y, o, x, c0,
                   c1);
        BARRIER();
    }
    const int64_t norm_f = M_HEAD + j->L * M_WEIGHTS + M_TAIL_NORM_F_W;
    if (id == 0)
        rms_norm(C, x, j->weights[norm_f], j->weight_bf16[norm_f], j->eps, j->hidden);
}

/* dims (weights.h's M_DIM_*): C, D (intermediate size), N (state size), K (conv kernel), R (time-step rank), L,
 * bf16 (the embedding's dtype); eps: the RMS norms'.
 * Returns a status. */
int mamba_decode(int64_t threads, const int64_t *dims, double eps, const void *const *weights,
                 const int64_t *transposed, const int64_t *weight_bf16, const void *embedding,
                 const float *const *state_in, float *const *state_out, float *hidden)
{
    struct mamba_job job = {dims[M_DIM_C], dims[M_DIM_D], dims[M_DIM_N], dims[M_DIM_K], dims[M_DIM_R], dims[M_DIM_L],
                            dims[M_DIM_BF16], (float)eps, weights,
                            transposed, weight_bf16, embedding, state_in, state_out, hidden, {0}};
    const int64_t C = job.C, D = job.D, N = job.N, R = job.R;
    if (!scratch_alloc(&job.s, 2 * C + 7 * D + R + 2 * N + D * N, C, threads))
        return STATUS_NO_MEMORY;
    run_team(threads, mamba_run, &job);
    free(job.s.shared);
    return STATUS_OK;
}
