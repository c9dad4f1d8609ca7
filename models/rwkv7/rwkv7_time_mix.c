/* RWKV-7's time mix after its matrix products, in C: the CPU path of models/rwkv7/'s TimeMix for prompts without
 * gradients (step.py's rwkv7_time_mix), and the middle of the RWKV-7 decoding step (rwkv7_step.c's rwkv7_run).
 * The recurrence is kernels/wkv7/wkv7.c's wkv7_forward. Threads: OpenMP's, torch's own (models/native/steps.h says
 * why). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "steps.h"
#include "rwkv7_step.h"

#ifdef _OPENMP
#include <omp.h>
#endif

/* RWKV-7's time mix between its matrix products, models/rwkv7/'s TimeMix from r, k, v and the LoRA outputs on:
 *     log_w = -e^-0.5 sigmoid(w0 + wl),  v += (v_first - v) sigmoid(v0 + vl) (blocks 1 ...),  a = sigmoid(a0 + al),
 *     kk = normalize(k k_k) per head,  k *= 1 + (a - 1) k_a,  y, state = WKV-7(r, log_w, k, v, -kk, kk a, state),
 *     out = (GroupNorm(y) + (r . k r_k per head) v) g
 * for work items (batch row b, head h) in [first, last), each walking its T tokens (wkv7.c's wkv7_forward for the
 * recurrence). r, k, v, v_first, wl, al, vl, g (B, T, H N) in the activations' dtype (ACT_BF16), v_first and vl
 * NULL in block 0; params: w0, a0, v0, k_k, k_a, r_k (H, N), ln_x weight, bias, each in its own dtype (params_bf16);
 * state (B, H, N, N) fp32, in and out; out (B, T, H N) in the activations' dtype. Returns a status. The prefill
 * calls it (step.py) with the (B, T) of a prompt, the decoding step (rwkv7_step.c) for its thread's heads.
 * The params' order, MIX_W0 .. MIX_PARAMS, is weights.h's, generated from step.py's TIME_MIX. */

#define MIX_CHUNK 128      /* tokens at a time: a chunk's 7 arrays of a head stay in the cache */

/* Tokens in the longest chunk of T: the scratch's arrays hold that many steps (a decoding step: one) */
static inline int64_t mix_chunk(int64_t T)
{
    return T < MIX_CHUNK ? T : MIX_CHUNK;
}

/* One (batch row, head) item of rwkv7_time_mix, MIX_CHUNK tokens at a time (the state carried from one to the next in
 * place), ACT_BF16 a constant in each copy so that the loops over the head's N numbers vectorize; q: the head's
 * params as fp32, [MIX_PARAMS][N]; scratch: 7 mix_chunk(T) N floats. */
static inline __attribute__((always_inline)) int time_mix_item(
    int64_t b, int64_t h, int64_t T, int64_t H, int64_t N, const int64_t act_bf16, const void *r, const void *k,
    const void *v, const void *v_first, const void *wl, const void *al, const void *vl, const void *g, const float *q,
    float group_eps, float *scratch, float *state, void *out)
{
    const int64_t C = H * N, S = mix_chunk(T) * N;
    float *R = scratch, *LW = R + S, *K = LW + S, *V = K + S, *AA = V + S, *BB = AA + S, *Y = BB + S;
    const float *w0 = q + MIX_W0 * N, *a0 = q + MIX_A0 * N, *v0 = q + MIX_V0 * N, *k_k = q + MIX_K_K * N;
    const float *k_a = q + MIX_K_A * N, *r_k = q + MIX_R_K * N, *lw = q + MIX_LN_X_W * N, *lb = q + MIX_LN_X_B * N;
    for (int64_t t0 = 0; t0 < T; t0 += MIX_CHUNK) {
        const int64_t steps = T - t0 < MIX_CHUNK ? T - t0 : MIX_CHUNK;
        for (int64_t t = 0; t < steps; t++) {
            const int64_t in = (b * T + t0 + t) * C + h * N, s = t * N;     /* (B, T, C) and the chunk's (t, N) */
            float norm = 0.0f;
            #pragma omp simd reduction(+:norm)
            for (int64_t i = 0; i < N; i++) {
                const float a = sigmoid(a0[i] + at(al, in + i, act_bf16)), kv = at(k, in + i, act_bf16);
                const float kk = kv * k_k[i];
                R[s + i] = at(r, in + i, act_bf16);
                LW[s + i] = -0.60653066f * sigmoid(w0[i] + at(wl, in + i, act_bf16));
                V[s + i] = at(v, in + i, act_bf16);
                K[s + i] = kv * (1.0f + (a - 1.0f) * k_a[i]);
                AA[s + i] = kk;                                             /* kk and a, before the norm */
                BB[s + i] = a;
                norm += kk * kk;
            }
            if (vl) {                                                       /* the value residual, blocks 1 ... */
                #pragma omp simd
                for (int64_t i = 0; i < N; i++)
                    V[s + i] += (at(v_first, in + i, act_bf16) - V[s + i]) * sigmoid(v0[i] + at(vl, in + i, act_bf16));
            }
            norm = sqrtf(norm);
            const float inv = poison(1.0f / (norm > 1e-12f ? norm : 1e-12f), is_nan(norm));   /* F.normalize's eps */
            #pragma omp simd
            for (int64_t i = s; i < s + N; i++) {
                BB[i] *= AA[i] * inv;                                       /* kk a */
                AA[i] *= -inv;                                              /* -kk */
            }
        }
        /* the chunk as a sequence of one head (B = H = 1), from and into this head's state */
        const int status = wkv7_forward(0, 1, steps, 1, N, R, LW, K, V, AA, BB, Y, state + (b * H + h) * N * N, 1,
                                        NULL, NULL);
        if (status)
            return status;
        for (int64_t t = 0; t < steps; t++) {
            const int64_t o = (b * T + t0 + t) * C + h * N, s = t * N;
            float mean = 0.0f, var = 0.0f, bonus = 0.0f;
            #pragma omp simd reduction(+:mean, bonus)
            for (int64_t i = 0; i < N; i++) {
                mean += Y[s + i];
                bonus += R[s + i] * K[s + i] * r_k[i];
            }
            mean /= (float)N;
            #pragma omp simd reduction(+:var)
            for (int64_t i = 0; i < N; i++)
                var += (Y[s + i] - mean) * (Y[s + i] - mean);
            const float inv = 1.0f / sqrtf(var / (float)N + group_eps);
            #pragma omp simd
            for (int64_t i = 0; i < N; i++)
                put(out, o + i, ((Y[s + i] - mean) * inv * lw[i] + lb[i] + bonus * V[s + i]) * at(g, o + i, act_bf16),
                    act_bf16);
        }
    }
    return STATUS_OK;
}

/* Items [first, last) of rwkv7_time_mix on one thread; returns a status */
int time_mix_items(int64_t first, int64_t last, int64_t T, int64_t H, int64_t N, int64_t act_bf16,
                   const void *r, const void *k, const void *v, const void *v_first, const void *wl,
                   const void *al, const void *vl, const void *g, const void *const *params,
                   const int64_t *params_bf16, float group_eps, float *state, void *out)
{
    float q[MIX_PARAMS * N], *scratch = malloc(7 * mix_chunk(T) * N * sizeof(float));
    int status = scratch ? STATUS_OK : STATUS_NO_MEMORY;
    for (int64_t item = first; item < last && !status; item++) {
        const int64_t b = item / H, h = item % H;
        for (int64_t p = 0; p < MIX_PARAMS; p++)
            for (int64_t i = 0; i < N; i++)
                q[p * N + i] = params[p] ? at(params[p], h * N + i, params_bf16[p]) : 0.0f;   /* v0: NULL in block 0 */
        if (act_bf16)
            status = time_mix_item(b, h, T, H, N, 1, r, k, v, v_first, wl, al, vl, g, q, group_eps, scratch, state,
                                   out);
        else
            status = time_mix_item(b, h, T, H, N, 0, r, k, v, v_first, wl, al, vl, g, q, group_eps, scratch, state,
                                   out);
    }
    free(scratch);
    return status;
}

/* The items (batch rows x heads) split over `threads` OpenMP threads (torch's, as for the decoding steps) */
int rwkv7_time_mix(int64_t threads, int64_t B, int64_t T, int64_t H, int64_t N, int64_t act_bf16,
                   const void *r, const void *k, const void *v, const void *v_first, const void *wl,
                   const void *al, const void *vl, const void *g, const void *const *params,
                   const int64_t *params_bf16, float group_eps, float *state, void *out)
{
    int status = STATUS_OK;     /* the threads' largest: any failure */
#ifdef _OPENMP
    #pragma omp parallel num_threads(threads) reduction(max:status)
    {
        int64_t first, last;
        share(B * H, 1, omp_get_thread_num(), omp_get_num_threads(), &first, &last);
        status = time_mix_items(first, last, T, H, N, act_bf16, r, k, v, v_first, wl, al, vl, g, params,
                                 params_bf16, group_eps, state, out);
    }
#else
    (void)threads;
    status = time_mix_items(0, B * H, T, H, N, act_bf16, r, k, v, v_first, wl, al, vl, g, params, params_bf16,
                            group_eps, state, out);
#endif
    return status;
}
