/* The C loops' shared entry points (exp_array, softplus_array, sum_rows); each recurrence's own loops, the CPU path
 * backend="c" (forward and backward, fp32), are in its op's package (kernels/wkv4/wkv4.c, kernels/wkv7/wkv7.c,
 * kernels/ssm/ssm.c), built with this file into one library by kernels/native.py. What follows holds for all of them.
 *
 * Why C: on a CPU each recurrence is a handful of multiply-adds and one or two exponentials per element, and every
 * eager torch formulation of it (chunked, in kernels/wkv4/, wkv7/, ssm/) makes about twenty passes over the
 * data, each its own trip through memory. One loop that walks time once does the same work in one pass, as the
 * Triton kernels do on a GPU, and follows their formulas (see the Python modules' docstrings). The backwards walk
 * time in reverse as the Triton backwards do: WKV-4 from what its forward saved per token, WKV-7 and the scan from
 * states their forwards saved every few steps (re-running those steps forward, then walking them back).
 *
 * Built by kernels/native.py with the system C compiler (its FLAGS say which and why). The inner loops run over
 * contiguous memory without dependences between iterations, so the compiler vectorizes them (`omp simd`; these loops
 * start no OpenMP threads); exp_clamped and softplus (native.h) are written so that they vectorize too. Each
 * function walks a range [first, last) of independent work items; kernels/native.py gives each thread a range.
 * Every work item writes outputs of its own (no two items add into one number), and sums over work items run
 * afterwards in a fixed order (sum_rows): results do not depend on the number of threads or their timing.
 * Every entry point returns a status (native.h's enum status: out of memory, a head size the loops do not take),
 * which kernels/native.py turns into an error.
 */
#include <float.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "native.h"

/* exp_clamped and softplus over an array: how tests measure their errors against float64 */
int exp_array(int64_t n, const float *x, float *out)
{
    #pragma omp simd
    for (int64_t i = 0; i < n; i++)
        out[i] = exp_clamped(x[i]);
    return STATUS_OK;
}

int softplus_array(int64_t n, const float *x, float *out)
{
    #pragma omp simd
    for (int64_t i = 0; i < n; i++)
        out[i] = softplus(x[i]);
    return STATUS_OK;
}

/* out[i] = sum_r in[r cols + i], the rows added in the order r = 0, 1, ... whatever the split: the sums over batch
 * rows (or groups of channels) of the parameter gradients. Work items: columns. */
int sum_rows(int64_t first, int64_t last, int64_t rows, int64_t cols, const float *in, float *out)
{
    #pragma omp simd
    for (int64_t i = first; i < last; i++)
        out[i] = in[i];
    for (int64_t r = 1; r < rows; r++) {
        const float *row = in + r * cols;
        #pragma omp simd
        for (int64_t i = first; i < last; i++)
            out[i] += row[i];
    }
    return STATUS_OK;
}
