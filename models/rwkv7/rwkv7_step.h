/* The entry points of RWKV-7's C step, as models/rwkv7/step.py's library reads them (its one signature
 * table, parsed by kernels/c_abi.py; the compiler checks the definitions against it). Each returns a status
 * (native.h's enum status). */
#ifndef SEQMIX_MODELS_RWKV7_STEP_H
#define SEQMIX_MODELS_RWKV7_STEP_H

#include <stdint.h>

int rwkv7_decode(int64_t threads, const int64_t *dims, double eps, double group_eps, const void *const *weights,
                 const int64_t *transposed, const int64_t *weight_bf16, const void *embedding,
                 const void *const *state_in, void *const *state_out, float *hidden);
int rwkv7_time_mix(int64_t threads, int64_t B, int64_t T, int64_t H, int64_t N, int64_t act_bf16,
                   const void *r, const void *k, const void *v, const void *v_first, const void *wl,
                   const void *al, const void *vl, const void *g, const void *const *params,
                   const int64_t *params_bf16, float group_eps, float *state, void *out);

#endif
