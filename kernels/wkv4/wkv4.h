/* The entry points of wkv4.c (RWKV-4's WKV's C loops, which it documents), as kernels/wkv4/c.py's ENTRIES
 * reads them: the one signature table of these loops (the compiler checks wkv4.c against it; the models' steps
 * include it to run the loops one token at a time). */
#ifndef SEQMIX_WKV4_H
#define SEQMIX_WKV4_H

#include <stdint.h>

int wkv4_forward(int64_t first, int64_t last, int64_t T, int64_t C, int64_t block,
                 const float *w, const float *u, const float *k, const float *v, float *y,
                 const float *num0, const float *den0, const float *max0, float *num_out, float *den_out,
                 float *max_out, float *lag_out, int32_t *bad_out, float *vy_save, float *d_save, float *z_save);
int wkv4_backward(int64_t first, int64_t last, int64_t T, int64_t C, int64_t block,
                  const float *w, const float *u, const float *k, const float *v,
                  const float *vy_save, const float *d_save, const float *z_save, const float *gy,
                  const float *num0, const float *den0, const float *max0, const float *num, const float *den,
                  const float *lag_in, const int32_t *bad, const float *gnum, const float *gden, const float *gmax,
                  float *gk, float *gv, float *gw_out, float *gu_out, float *gnum0, float *gden0, float *gmax0);

#endif
