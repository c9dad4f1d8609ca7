/* The entry points of RWKV-4's C step, as models/rwkv4/step.py's library reads them (its one signature
 * table, parsed by kernels/c_abi.py; the compiler checks the definitions against it). Each returns a status
 * (native.h's enum status). */
#ifndef SEQMIX_MODELS_RWKV4_STEP_H
#define SEQMIX_MODELS_RWKV4_STEP_H

#include <stdint.h>

int rwkv4_decode(int64_t threads, const int64_t *dims, double eps, const void *const *weights,
                 const int64_t *transposed, const int64_t *weight_bf16, const void *embedding,
                 const float *const *state_in, float *const *state_out, float *hidden);

#endif
