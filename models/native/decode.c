/* One decoding step of a whole model (one token of one sequence) in one call: the CPU path of models/decode.py's
 * steps. RWKV-7's time mix after its matrix products, which its step runs too, is rwkv7_time_mix.c.
 *
 * Why: decoding reads every weight once per token, and a step written as torch ops spends 30-60% on top of that read
 * in the thousand-odd small ops between the matrix products (layer norms, token-shift mixes, gates, the
 * recurrence's step), each a few microseconds of dispatch (benchmarks/results/models.md). Here a step is the matrix
 * products at the memory's speed and the rest in a few microseconds per layer: the work torch spends in dispatch.
 *
 * The math is the models' (models/rwkv4.py, rwkv7.py, mamba.py, whose docstrings cite the sources); the
 * recurrences are the ops' own loops (kernels/<op>/<op>.c: wkv4_forward, wkv7_forward, selective_scan_forward)
 * run for T = 1, so there
 * is one copy of each. Everything is computed in fp32 from the weights as stored (fp32 or bf16, widened as read);
 * the states are those of the models' forward, read from one set of tensors and written to another.
 *
 * Weights: each step takes one array of pointers, in the order of models/decode.py's tables (LAYOUTS: the weights
 * before the blocks, each block's, and those after), from which models/decode.py generates weights.h, whose enums
 * the code below reads (R4_*, R7_*, M_*: a weight's place in a block; *_HEAD: the weights before the first block;
 * *_TAIL_*: a weight's place after the last), and packs the pointers: one list, read by both.
 *
 * Threads: a step runs on `threads` threads (models/decode.py passes torch.get_num_threads()) that split each
 * matrix product by output rows and the recurrences by channels (whole heads, whole blocks), and meet at a barrier
 * wherever one needs another's rows (four or five times a layer). Small vectors every thread needs (a layer norm's
 * output, the token-shift mixes) each thread computes for itself. Every number is computed by one thread in a fixed
 * order, so results are the same with any thread count.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "steps.h"

/* ------------------------------------------------------------------------------------------------ threads */

/* The step's threads are OpenMP's. Built with -fopenmp against the libgomp that torch has loaded (the same soname,
 * so the loader hands this library torch's copy), they are torch's own intra-op threads: a team of fresh threads
 * would compete for the cores with torch's, which spin for a few milliseconds after each parallel torch op (3.5 ms a
 * step measured, of 15). Without OpenMP (a compiler without it: kernels/native.py falls back) the step runs on one
 * thread. */
#ifdef _OPENMP
#include <omp.h>
#define BARRIER() _Pragma("omp barrier")
#else
#define BARRIER()
#endif

/* run(job, id, threads) on each thread of a team of up to `threads` */
static void run_team(int64_t threads, void (*run)(void *, int64_t, int64_t), void *job)
{
#ifdef _OPENMP
    #pragma omp parallel num_threads(threads)
    run(job, omp_get_thread_num(), omp_get_num_threads());
#else
    (void)threads;
    run(job, 0, 1);
#endif
}

typedef uint32_t vuint __attribute__((vector_size(VEC * sizeof(uint32_t))));
typedef uint32_t vuint_u __attribute__((vector_size(VEC * sizeof(uint32_t)), aligned(sizeof(uint16_t))));

#define ROWS 4
#define AHEAD 512   /* bytes of a row asked for ahead of the loads: the rows (1.5-6 KB) are too short for the hardware
                       prefetcher to reach full speed on its own (bf16 9.3 -> 13.4 GB/s on one thread, measured) */

/* VEC weights from a row of W (fp32), or 2 VEC (bf16: two bf16 in each 32-bit lane, widened as they lie: the
 * low one (even column) shifted up, the high one (odd column) masked; their x are the even and odd columns) */
static inline __attribute__((always_inline)) void row_pair(const void *W, const int64_t bf16, int64_t at, vfloat *even,
                                                           vfloat *odd)
{
    if (bf16) {
        const vuint bits = *(const vuint_u *)((const uint16_t *)W + at);
        const vuint lo = bits << 16, hi = bits & 0xffff0000u;
        memcpy(even, &lo, sizeof *even);
        memcpy(odd, &hi, sizeof *odd);
    } else {
        *even = LOADV((const float *)W + at);
        *odd = LOADV((const float *)W + at + VEC);
    }
}

/* y[i .. i + rows) = scale (W[i] . x) + (bias ? bias[i] : 0), for W (rows x K, row-major) and x fp32 (K): rows
 * (ROWS, or 1 for the last few) and BF16 are constants in each copy, so that the partial sums (two a row: eight
 * multiply-adds in flight) stay in registers. A step takes 2 VEC columns: x0, x1 the columns' x as row_pair pairs
 * them (fp32: the first and second VEC; bf16: the even and odd ones, from xe, xo). */
static inline __attribute__((always_inline)) void dot_rows(const void *W, const void *bias, const int64_t bf16,
                                                           int64_t bias_bf16, const int64_t rows, int64_t K,
                                                           const float *x,
                                                           const float *xe, const float *xo, float scale, float *y,
                                                           int64_t i)
{
    const int64_t whole = K / (2 * VEC) * (2 * VEC);
    vfloat acc[ROWS][2] = {{0}};
    for (int64_t j = 0; j < whole; j += 2 * VEC) {
        const vfloat x0 = bf16 ? LOADV(xe + j / 2) : LOADV(x + j), x1 = bf16 ? LOADV(xo + j / 2) : LOADV(x + j + VEC);
        #pragma GCC unroll 4
        for (int64_t r = 0; r < rows; r++) {
            vfloat w0, w1;
            __builtin_prefetch((const char *)W + ((i + r) * K + j) * (bf16 ? 2 : 4) + AHEAD);
            row_pair(W, bf16, (i + r) * K + j, &w0, &w1);
            acc[r][0] += w0 * x0;
            acc[r][1] += w1 * x1;
        }
    }
    for (int64_t r = 0; r < rows; r++) {
        float sum = 0.0f;
        for (int64_t j = whole; j < K; j++)
            sum += at(W, (i + r) * K + j, bf16) * x[j];
        const vfloat total = acc[r][0] + acc[r][1];
        for (int64_t l = 0; l < VEC; l++)
            sum += total[l];
        y[i + r] = scale * sum + (bias ? at(bias, i + r, bias_bf16) : 0.0f);
    }
}

/* y[i] for rows i in [lo, hi), ROWS at a time: four streams from memory in flight, and x read once for the four */
static inline __attribute__((always_inline)) void gemv_rows(const void *W, const void *bias, const int64_t bf16,
                                                            int64_t bias_bf16, int64_t K, const float *x,
                                                            const float *xe, const float *xo, float scale, float *y,
                                                            int64_t lo, int64_t hi)
{
    int64_t i = lo;
    for (; i + ROWS <= hi; i += ROWS)
        dot_rows(W, bias, bf16, bias_bf16, ROWS, K, x, xe, xo, scale, y, i);
    for (; i < hi; i++)
        dot_rows(W, bias, bf16, bias_bf16, 1, K, x, xe, xo, scale, y, i);
}

static void gemv(const void *W, const void *bias, int64_t bf16, int64_t bias_bf16, int64_t K, const float *x,
                 float scale, float *y,
                 int64_t lo, int64_t hi)
{
    if (!bf16) {
        gemv_rows(W, bias, 0, bias_bf16, K, x, NULL, NULL, scale, y, lo, hi);
        return;
    }
    float xe[K / 2 + 1], xo[K / 2 + 1];
    for (int64_t j = 0; j < K / 2; j++) {
        xe[j] = x[2 * j];
        xo[j] = x[2 * j + 1];
    }
    gemv_rows(W, bias, 1, bias_bf16, K, x, xe, xo, scale, y, lo, hi);
}

/* y[j] = sum_i x[i] W[i][j] for columns j in [lo, hi) of W (K x M, row-major) */
static void gemv_columns(const void *W, int64_t bf16, int64_t K, int64_t M, const float *x, float *y, int64_t lo,
                         int64_t hi)
{
    for (int64_t j = lo; j < hi; j++)
        y[j] = 0.0f;
    for (int64_t i = 0; i < K; i++) {
        const float xi = x[i];
        if (bf16) {
            const uint16_t *row = (const uint16_t *)W + i * M;
            #pragma omp simd
            for (int64_t j = lo; j < hi; j++)
                y[j] += xi * widen(row[j]);
        } else {
            const float *row = (const float *)W + i * M;
            #pragma omp simd
            for (int64_t j = lo; j < hi; j++)
                y[j] += xi * row[j];
        }
    }
}

/* y[i] = scale (W x)[i] + (bias ? bias[i] : 0) for i in [lo, hi), W (rows x K) as the model applies it, stored
 * row-major, or (TRANSPOSED) as its transpose, a K x rows row-major array: RWKV-7's LoRA matrices come one way from
 * BlinkDL's checkpoints and the other from fla's layout (models/rwkv7_fla.py maps them as views, not copies). */
static void matvec(const void *W, int64_t transposed, int64_t bf16, const void *bias, int64_t bias_bf16,
                   int64_t rows, int64_t K,
                   const float *x, float scale, float *y, int64_t lo, int64_t hi)
{
    if (!transposed) {
        gemv(W, bias, bf16, bias_bf16, K, x, scale, y, lo, hi);
        return;
    }
    gemv_columns(W, bf16, K, rows, x, y, lo, hi);
    for (int64_t i = lo; i < hi; i++)
        y[i] = scale * y[i] + (bias ? at(bias, i, bias_bf16) : 0.0f);
}

/* x[i] += (W in)[i] for i in [lo, hi): a block's output into the residual stream (out: scratch, rows floats) */
static void add_matvec(const void *W, int64_t transposed, int64_t bf16, const void *bias, int64_t bias_bf16,
                       int64_t rows, int64_t K,
                       const float *in, float *out, float *x, int64_t lo, int64_t hi)
{
    matvec(W, transposed, bf16, bias, bias_bf16, rows, K, in, 1.0f, out, lo, hi);
    for (int64_t i = lo; i < hi; i++)
        x[i] += out[i];
}

/* ------------------------------------------------------------------------------------------------ vectors */

/* e^x of a weight (a log decay), NaN for a NaN x, which exp_clamped's clamp would make finite: the recurrences test
 * the bits of what they read, but a NaN weight must reach them as NaN */
static inline float exp_nan(float x)
{
    return poison(exp_clamped(x), is_nan(x));
}

/* out = (x - mean) / sqrt(var + eps) * weight + bias over n numbers (torch's layer norm, biased variance) */
static void layer_norm(int64_t n, const float *x, const void *weight, int64_t weight_bf16, const void *bias,
                       int64_t bias_bf16, float eps, float *out)
{
    float mean = 0.0f, var = 0.0f;
    for (int64_t i = 0; i < n; i++)
        mean += x[i];
    mean /= (float)n;
    for (int64_t i = 0; i < n; i++)
        var += (x[i] - mean) * (x[i] - mean);
    const float inv = 1.0f / sqrtf(var / (float)n + eps);
    for (int64_t i = 0; i < n; i++)
        out[i] = (x[i] - mean) * inv * at(weight, i, weight_bf16) + at(bias, i, bias_bf16);
}

/* out = x / sqrt(mean(x^2) + eps) * weight (Mamba's RMSNorm) */
static void rms_norm(int64_t n, const float *x, const void *weight, int64_t bf16, float eps, float *out)
{
    float squares = 0.0f;
    for (int64_t i = 0; i < n; i++)
        squares += x[i] * x[i];
    const float inv = 1.0f / sqrtf(squares / (float)n + eps);
    for (int64_t i = 0; i < n; i++)
        out[i] = x[i] * inv * at(weight, i, bf16);
}

/* x = the token's embedding row (C), layer-normed by weights[0], weights[1]: the RWKV models normalize the
 * embeddings first (RWKV-4's pre_ln, RWKV-7's ln0); tmp: C floats */
static void embed_normed(int64_t C, const void *embedding, int64_t bf16, const void *const *weights,
                         const int64_t *weight_bf16, float eps, float *tmp, float *x)
{
    for (int64_t i = 0; i < C; i++)
        tmp[i] = at(embedding, i, bf16);
    layer_norm(C, tmp, weights[0], weight_bf16[0], weights[1], weight_bf16[1], eps, x);
}

/* Scratch for a step: `shared` floats all threads see, `own` floats for each thread, zeroed. */
struct scratch {
    float *shared, *own;
    int64_t own_size;
};

static int scratch_alloc(struct scratch *s, int64_t shared, int64_t own, int64_t threads)
{
    s->own_size = (own + 15) / 16 * 16;      /* whole cache lines: threads' buffers never share one */
    s->shared = calloc((size_t)(shared + s->own_size * threads + 16), sizeof(float));
    s->own = s->shared + (shared + 15) / 16 * 16;
    return s->shared != NULL;
}

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
