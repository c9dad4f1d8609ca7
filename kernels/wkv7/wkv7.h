/* The entry points of wkv7.c (RWKV-7's WKV's C loops, which it documents), as kernels/wkv7/c.py's ENTRIES
 * reads them: the one signature table of these loops (the compiler checks wkv7.c against it; the models' steps
 * include it to run the loops one token at a time). */
#ifndef SEQMIX_WKV7_H
#define SEQMIX_WKV7_H

#include <stdint.h>

int64_t wkv7_padded_size(int64_t N);
int64_t wkv7_max_head_size(void);
int wkv7_forward(int64_t first, int64_t last, int64_t T, int64_t H, int64_t N,
                 const float *r, const float *log_w, const float *k, const float *v, const float *a,
                 const float *b, float *y, float *state, int64_t ck, float *ckpt, int32_t *bad_out);
int wkv7_backward(int64_t first, int64_t last, int64_t T, int64_t H, int64_t N,
                  const float *r, const float *log_w, const float *k, const float *v, const float *a,
                  const float *b, const float *dy, const float *dstate, int64_t ck, const float *ckpt,
                  const int32_t *bad, float *dr, float *dlog_w, float *dk, float *dv, float *da, float *db,
                  float *dstate0);

#endif
