/* The entry points of ssm.c (the selective scan's C loops, which it documents), as kernels/ssm/c.py's ENTRIES
 * reads them: the one signature table of these loops (the compiler checks ssm.c against it; the models' steps
 * include it to run the loops one token at a time). */
#ifndef SEQMIX_SSM_H
#define SEQMIX_SSM_H

#include <stdint.h>

int64_t selective_scan_lanes(void);
int selective_scan_forward(int64_t first, int64_t last, int64_t D, int64_t T, int64_t N, int64_t delta_softplus,
                           const float *u, const float *delta, const float *delta_bias, const float *A,
                           const float *Bt, const float *Ct, const float *Dskip, const float *z, float *y,
                           float *state, int64_t ck, float *ckpt, int32_t *bad_out);
int selective_scan_backward(int64_t first, int64_t last, int64_t D, int64_t T, int64_t N, int64_t delta_softplus,
                            int64_t per_group, const float *u, const float *delta, const float *delta_bias,
                            const float *A, const float *Bt, const float *Ct, const float *Dskip, const float *z,
                            int64_t ck, const float *ckpt, const int32_t *bad_in, const float *dy,
                            const float *dlast, float *du, float *ddelta, float *dz, float *dA_part,
                            float *dB_part, float *dC_part, float *dD_part, float *dbias_part, float *dstate);

#endif
