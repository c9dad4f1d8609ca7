/* RWKV-7's WKV as a plain C loop, forward and backward (fp32): the op's backend="c", bound by kernels/wkv7/c.py.
 * What every op's loops share (the vectorizable e^x and softplus, the vector types, the status codes, the
 * scratch buffers) is in kernels/native.h; kernels/native.c says why the loops are C and how they are built. */
#include <float.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "native.h"
#include "wkv7.h"

/* RWKV-7: S_t = S_{t-1} diag(e^{log_w_t}) + (S_{t-1} a_t) b_t^T + v_t k_t^T, y_t = S_t r_t.
 * r, log_w, k, v, a, b, y (B, T, H, N); state (B, H, N, N) indexed [value, key], in, overwritten with the last
 * state. A work item is a (batch, head) pair, whose time it walks. A head's outputs and state are NaN from its
 * first non-finite log_w, k, v, a, b or state entry on; r enters y_t alone, by products and sums, which carry a
 * NaN in it to y_t and no further. For the backward (ckpt not NULL): the state before every ck-th token, ckpt
 * (B H, ceil(T / ck), NP, NP) as the forward keeps it (below), and bad (B H): whether the head met a non-finite
 * input.
 *
 * Whole vectors. The loops work on vectors of VEC floats written as vector variables (GCC's and Clang's vector
 * extensions): the sums over a head's rows then stay in registers. Written as loops over arrays, the compiler kept
 * them in memory, every multiply-add of a sum waiting on the store and load of the one before (2x-3x slower
 * measured). A head of N floats is padded to NP = VEC ceil(N / VEC): the padding holds zeros (r, k, v, a, b, dy,
 * the state) and decays of 1, under which it stays zero and adds nothing; N = 32 and 64 need none. Where one sum
 * has few vectors (V = NP / VEC < CHAINS), it is split into CHAINS / V partial sums: eight independent chains of
 * multiply-adds, enough to cover each one's latency.
 *
 * The forward keeps the state transposed, St[key][value], so that each product is a sum of rows scaled by numbers,
 * with a vector of independent sums over the values instead of a sum across each row:
 *     sa = sum_j a_j St[j],   St[j] = e^{log_w_j} St[j] + b_j sa + k_j v,   y = sum_j r_j St[j].
 * The inputs of a head are a row of H N numbers apart from one token to the next, which the hardware prefetcher
 * does not follow, so the loop asks for them PREFETCH tokens ahead. */
#define CHAINS 8
#define MAX_V 16      /* vectors per row at most: head sizes up to 256 (kernels/wkv7/ sends larger ones to torch) */
#define PREFETCH 2

/* Two vectors' lanes picked by constant indices (0-15 the first's, 16-31 the second's): Clang's builtin, which GCC
 * has from version 12 on; GCC's own before. */
#if defined(__clang__) || __GNUC__ >= 12
#define PICK(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define PICK(a, b, ...) __builtin_shuffle(a, b, (vint){__VA_ARGS__})
#endif

/* The sums of 16 vectors' lanes at once, lane l of the result the sum of row l's, where x[bit_reversed[l]] holds
 * row l; x is overwritten. Each level adds pairs of vectors' halves, two rows' halves in one vector: 15 pairs of
 * shuffles and additions for 16 rows, where a tree of halves per row takes 64 of each. Level by level a vector
 * holds twice as many rows, interleaved from its pair: after four, lane l holds the row whose index is l with its
 * four bits reversed, hence the rows' places in x. */
_Static_assert(VEC == 16, "sum_lanes is written for 16 lanes");
static const int32_t bit_reversed[16] = {0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15};

static inline __attribute__((always_inline)) vfloat sum_lanes(vfloat *x)
{
    for (int64_t p = 0; p < 8; p++) {     /* the low half of each row's lanes plus the high half */
        const vfloat a = x[2 * p], b = x[2 * p + 1];
        x[p] = PICK(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23)
               + PICK(a, b, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    }
    for (int64_t p = 0; p < 4; p++) {
        const vfloat a = x[2 * p], b = x[2 * p + 1];
        x[p] = PICK(a, b, 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27)
               + PICK(a, b, 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
    }
    for (int64_t p = 0; p < 2; p++) {
        const vfloat a = x[2 * p], b = x[2 * p + 1];
        x[p] = PICK(a, b, 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29)
               + PICK(a, b, 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
    }
    return PICK(x[0], x[1], 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30)
           + PICK(x[0], x[1], 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31);
}

/* x (N floats) as NP floats: x itself, or a copy into buf padded with fill */
static inline __attribute__((always_inline)) const float *padded(const float *x, int64_t N, int64_t NP, float fill,
                                                                 float *buf)
{
    if (N == NP)
        return x;
    memcpy(buf, x, N * sizeof(float));
    for (int64_t i = N; i < NP; i++)
        buf[i] = fill;
    return buf;
}

/* One token's inputs of a head, NP floats each (padded), w = e^{log_w}; bad: whether log_w, k, v, a or b holds a
 * non-finite number other than a log_w of -inf, a decay of 0 (e^-87 here, as the other backends' most negative
 * finite log_w: kernels/wkv7/ hands log_w to the loop as it came, saving two passes over it each way). */
struct wkv7_token {
    const float *r, *k, *v, *a, *b;
    float *w;
    int32_t bad;
};

/* NP floats of scratch for each of r, k, v, a, b, dy (copies where padded) and w */
#define WKV7_PAD_BUFFERS 7

static inline __attribute__((always_inline)) void wkv7_load(int64_t N, int64_t NP, int64_t off, const float *r,
                                                            const float *log_w, const float *k, const float *v,
                                                            const float *a, const float *b, float *pad,
                                                            struct wkv7_token *x)
{
    int32_t bad = 0;
    x->w = pad + 6 * NP;
    #pragma omp simd reduction(|:bad)
    for (int64_t j = 0; j < N; j++) {
        x->w[j] = exp_clamped(log_w[off + j]);
        bad |= nan_or_plus_inf(log_w[off + j]) | nonfinite(k[off + j]) | nonfinite(v[off + j]) | nonfinite(a[off + j])
               | nonfinite(b[off + j]);
    }
    for (int64_t j = N; j < NP; j++)
        x->w[j] = 1.0f;
    x->bad = bad;
    x->r = padded(r + off, N, NP, 0.0f, pad);
    x->k = padded(k + off, N, NP, 0.0f, pad + NP);
    x->v = padded(v + off, N, NP, 0.0f, pad + 2 * NP);
    x->a = padded(a + off, N, NP, 0.0f, pad + 3 * NP);
    x->b = padded(b + off, N, NP, 0.0f, pad + 4 * NP);
}

/* sum over the CHAINS / V partial sums acc[p V + c] into out[c], c < V */
static inline __attribute__((always_inline)) void gather_partials(int64_t V, int64_t P, const vfloat *acc, vfloat *out)
{
    #pragma GCC unroll 16
    for (int64_t c = 0; c < V; c++) {
        out[c] = acc[c];
        #pragma GCC unroll 8
        for (int64_t p = 1; p < P; p++)
            out[c] += acc[p * V + c];
    }
}

/* One step on St (transposed, NP x NP), y_t = S_t r_t into out (NP floats). */
static inline __attribute__((always_inline)) void wkv7_step(int64_t NP, float *St, const struct wkv7_token *x,
                                                            float *out)
{
    const int64_t V = NP / VEC, P = V < CHAINS ? CHAINS / V : 1, A = V * P;
    vfloat acc[MAX_V > CHAINS ? MAX_V : CHAINS], sa[MAX_V], v[MAX_V], y[MAX_V];
    #pragma GCC unroll 16
    for (int64_t c = 0; c < A; c++)
        acc[c] = (vfloat){0};
    for (int64_t j = 0; j < NP; j += P)                                /* sa = S_{t-1} a_t */
        #pragma GCC unroll 8
        for (int64_t p = 0; p < P; p++)
            #pragma GCC unroll 16
            for (int64_t c = 0; c < V; c++)
                acc[p * V + c] += x->a[j + p] * LOADV(St + (j + p) * NP + c * VEC);
    gather_partials(V, P, acc, sa);
    #pragma GCC unroll 16
    for (int64_t c = 0; c < A; c++)
        acc[c] = (vfloat){0};
    #pragma GCC unroll 16
    for (int64_t c = 0; c < V; c++)
        v[c] = LOADV(x->v + c * VEC);
    for (int64_t j = 0; j < NP; j += P)                                /* S_t, and y_t = S_t r_t */
        #pragma GCC unroll 8
        for (int64_t p = 0; p < P; p++)
            #pragma GCC unroll 16
            for (int64_t c = 0; c < V; c++) {
                float *row = St + (j + p) * NP + c * VEC;
                const vfloat s = x->w[j + p] * LOADV(row) + x->b[j + p] * sa[c] + x->k[j + p] * v[c];
                STOREV(row, s);
                acc[p * V + c] += x->r[j + p] * s;
            }
    gather_partials(V, P, acc, y);
    #pragma GCC unroll 16
    for (int64_t c = 0; c < V; c++)
        STOREV(out + c * VEC, y[c]);
}

static inline __attribute__((always_inline)) void wkv7_item(
    int64_t item, int64_t T, int64_t H, int64_t N, int64_t NP, const float *r, const float *log_w, const float *k,
    const float *v, const float *a, const float *b, float *y, float *state, float *St, float *pad, int64_t ck,
    float *ckpt, int32_t *bad_out)
{
    const int64_t bi = item / H, h = item % H, n_ckpt = (T + ck - 1) / ck;
    float *S = state + item * N * N, out[MAX_V * VEC];
    struct wkv7_token x;
    int32_t bad = 0;
    memset(St, 0, NP * NP * sizeof(float));
    for (int64_t i = 0; i < N; i++)
        for (int64_t j = 0; j < N; j++) {
            St[j * NP + i] = S[i * N + j];
            bad |= nonfinite(S[i * N + j]);
        }
    for (int64_t t = 0; t < T; t++) {
        const int64_t off = ((bi * T + t) * H + h) * N;
        if (t + PREFETCH < T)
            for (int64_t j = 0; j < N; j += 16) {                      /* 16 floats: a cache line */
                const int64_t ahead = off + PREFETCH * H * N + j;
                __builtin_prefetch(r + ahead);
                __builtin_prefetch(log_w + ahead);
                __builtin_prefetch(k + ahead);
                __builtin_prefetch(v + ahead);
                __builtin_prefetch(a + ahead);
                __builtin_prefetch(b + ahead);
            }
        if (ckpt && t % ck == 0)
            memcpy(ckpt + (item * n_ckpt + t / ck) * NP * NP, St, NP * NP * sizeof(float));
        wkv7_load(N, NP, off, r, log_w, k, v, a, b, pad, &x);
        bad |= x.bad;
        wkv7_step(NP, St, &x, out);
        for (int64_t i = 0; i < N; i++)
            y[off + i] = poison(out[i], bad);
    }
    for (int64_t i = 0; i < N; i++)
        for (int64_t j = 0; j < N; j++)
            S[i * N + j] = poison(St[j * NP + i], bad);
    if (bad_out)
        bad_out[item] = bad;
}

/* The head size padded to whole vectors: NP, which the checkpoints take (native.py asks for it) */
int64_t wkv7_padded_size(int64_t N)
{
    return (N + VEC - 1) / VEC * VEC;
}

/* The largest head size the loops take */
int64_t wkv7_max_head_size(void)
{
    return MAX_V * VEC;
}

int wkv7_forward(int64_t first, int64_t last, int64_t T, int64_t H, int64_t N,
                 const float *r, const float *log_w, const float *k, const float *v, const float *a,
                 const float *b, float *y, float *state, int64_t ck, float *ckpt, int32_t *bad_out)
{
    if (N > MAX_V * VEC)      /* kernels/wkv7/ sends larger heads to torch */
        return STATUS_HEAD_SIZE;
    const int64_t NP = wkv7_padded_size(N);
    float *St = scratch_floats(NP * NP + WKV7_PAD_BUFFERS * NP);
    if (!St)
        return STATUS_NO_MEMORY;
    for (int64_t item = first; item < last; item++) {
        if (N == 32)        /* NP a constant: each row's vectors unrolled, in registers (1.6x-1.9x measured) */
            wkv7_item(item, T, H, 32, 32, r, log_w, k, v, a, b, y, state, St, St + 32 * 32, ck, ckpt, bad_out);
        else if (N == 64)   /* RWKV-7's head size */
            wkv7_item(item, T, H, 64, 64, r, log_w, k, v, a, b, y, state, St, St + 64 * 64, ck, ckpt, bad_out);
        else
            wkv7_item(item, T, H, N, NP, r, log_w, k, v, a, b, y, state, St, St + NP * NP, ck, ckpt, bad_out);
    }
    free(St);
    return STATUS_OK;
}

/* The backward of wkv7_forward, kernels/wkv7/__init__.py's Triton backward with G = dL/dS_t:
 *     G += dy_t r_t^T;  dr_t = S_t^T dy_t;  dv_t = G k_t;  dk_t = G^T v_t;  q = G b_t;  db_t = G^T (S_{t-1} a_t);
 *     da_t = S_{t-1}^T q;  dlog_w_t = w_t * colsum(G * S_{t-1});  G <- G diag(w_t) + q a_t^T   (= dL/dS_{t-1})
 * with dr_t = w_t (S_{t-1}^T dy_t) + b_t (sa . dy_t) + k_t (v_t . dy_t), S_t expanded as the Triton kernel does.
 * For each chunk of ck steps from the last: re-run it forward from its checkpoint, keeping S_{t-1} and
 * sa = S_{t-1} a_t of every step, then walk it back. Unlike the forward, G and the re-run states are kept
 * [value][key], as the state is: the key-vector gradients (sums over values) are then sums of rows scaled by
 * numbers, vectors of independent sums across the rows, and one pass over the rows of G and S_{t-1} does a whole
 * step, including the next step's G += dy r^T and its dot products q = G b, dv = G k (about 10% faster measured
 * than G transposed and a pass for each). dy (B, T, H, N); dstate (B, H, N, N): the cotangent of the last state.
 * Out: dr, dlog_w, dk, dv, da, db (B, T, H, N), dstate0 (B, H, N, N). A work item is a (batch, head) pair, which
 * writes its own outputs alone; a head that met a non-finite input has NaN gradients. */

/* Row i of G (V vectors, in g): G_i += dy_i r^T, then q_i = G_i . b and gv_i = G_i . k as vectors of partial sums
 * (sum_lanes adds their lanes, 16 rows at a time) */
static inline __attribute__((always_inline)) void wkv7_add_output(int64_t V, vfloat *g, float dyi,
                                                                  const struct wkv7_token *x, vfloat *qi, vfloat *gvi)
{
    vfloat q = {0}, gv = {0};
    #pragma GCC unroll 16
    for (int64_t c = 0; c < V; c++) {
        g[c] += dyi * LOADV(x->r + c * VEC);
        q += g[c] * LOADV(x->b + c * VEC);
        gv += g[c] * LOADV(x->k + c * VEC);
    }
    *qi = q;
    *gvi = gv;
}

/* The backward's start, at the last token: G = dstate (padded with zeros), then that token's G += dy r^T and its
 * q = G b, gv = G k. x: filled with the last token's inputs. */
static inline __attribute__((always_inline)) void wkv7_backward_start(
    int64_t item, int64_t T, int64_t H, int64_t N, int64_t NP, const float *r, const float *log_w, const float *k,
    const float *v, const float *a, const float *b, const float *dy, const float *dstate, float *G, float *pad,
    struct wkv7_token *x, float *q, float *gv, vfloat *q_rows, vfloat *gv_rows)
{
    const int64_t bi = item / H, h = item % H, V = NP / VEC;
    memset(G, 0, NP * NP * sizeof(float));
    for (int64_t i = 0; i < N; i++)
        memcpy(G + i * NP, dstate + (item * N + i) * N, N * sizeof(float));
    const int64_t last = ((bi * T + T - 1) * H + h) * N;
    wkv7_load(N, NP, last, r, log_w, k, v, a, b, pad, x);
    const float *dy_t = padded(dy + last, N, NP, 0.0f, pad + 5 * NP);
    for (int64_t i = 0; i < NP; i++) {
        vfloat g[MAX_V];
        for (int64_t c = 0; c < V; c++)
            g[c] = LOADV(G + i * NP + c * VEC);
        wkv7_add_output(V, g, dy_t[i], x, q_rows + bit_reversed[i % 16], gv_rows + bit_reversed[i % 16]);
        for (int64_t c = 0; c < V; c++)
            STOREV(G + i * NP + c * VEC, g[c]);
        if (i % 16 == 15) {
            STOREV(q + i - 15, sum_lanes(q_rows));
            STOREV(gv + i - 15, sum_lanes(gv_rows));
        }
    }
}

/* A chunk of L steps from t0 re-run forward from its checkpoint St (the forward's layout, [key][value]): history[l]
 * = S_{t-1} ([value][key]) and sas[l] = S_{t-1} a_t, t = t0 + l (history[0] is the checkpoint transposed). */
static inline __attribute__((always_inline)) void wkv7_chunk_rerun(
    int64_t item, int64_t T, int64_t H, int64_t N, int64_t NP, int64_t t0, int64_t L, const float *St,
    const float *r, const float *log_w, const float *k, const float *v, const float *a, const float *b, float *pad,
    struct wkv7_token *x, float *history, float *sas)
{
    const int64_t bi = item / H, h = item % H, V = NP / VEC;
    vfloat sa_rows[16];                                    /* 16 rows' partial sums, for sum_lanes */
    for (int64_t i = 0; i < NP; i++)
        for (int64_t j = 0; j < NP; j++)
            history[i * NP + j] = St[j * NP + i];
    for (int64_t l = 0; l < L; l++) {        /* history[l] = S_{t-1}, sas[l] = S_{t-1} a_t, t = t0 + l */
        const float *S = history + l * NP * NP;
        float *next = history + (l + 1) * NP * NP;
        wkv7_load(N, NP, ((bi * T + t0 + l) * H + h) * N, r, log_w, k, v, a, b, pad, x);
        float *sa = sas + l * NP;
        for (int64_t i = 0; i < NP; i++) {
            vfloat dot = {0};
            #pragma GCC unroll 16
            for (int64_t c = 0; c < V; c++)
                dot += LOADV(S + i * NP + c * VEC) * LOADV(x->a + c * VEC);
            sa_rows[bit_reversed[i % 16]] = dot;
            if (i % 16 == 15)
                STOREV(sa + i - 15, sum_lanes(sa_rows));
        }
        if (l + 1 < L)
            for (int64_t i = 0; i < NP; i++)
                #pragma GCC unroll 16
                for (int64_t c = 0; c < V; c++)
                    STOREV(next + i * NP + c * VEC, LOADV(x->w + c * VEC) * LOADV(S + i * NP + c * VEC)
                           + sa[i] * LOADV(x->b + c * VEC) + x->v[i] * LOADV(x->k + c * VEC));
    }
}

/* Step t's pass over the rows of G and S = S_{t-1}: the vector sums gs = colsum(G * S), g_v = G^T v,
 * g_sa = G^T sa, s_q = S^T q, s_dy = S^T dy (zeroed here), G <- G diag(w_t) + q a_t^T; and for t > 0, while the
 * row is at hand, the step before's G += dy r^T and its q = G b, gv = G k (x: step t's inputs, before: step
 * t - 1's). */
static inline __attribute__((always_inline)) void wkv7_backward_rows(
    int64_t t, int64_t NP, const float *S, const float *sa, const float *dy_t, const float *dy_before,
    const struct wkv7_token *x, const struct wkv7_token *before, float *G, float *q, float *gv, vfloat *q_rows,
    vfloat *gv_rows, vfloat *gs, vfloat *g_v, vfloat *g_sa, vfloat *s_q, vfloat *s_dy)
{
    const int64_t V = NP / VEC;
    #pragma GCC unroll 16
    for (int64_t c = 0; c < V; c++)
        gs[c] = g_v[c] = g_sa[c] = s_q[c] = s_dy[c] = (vfloat){0};
    for (int64_t i = 0; i < NP; i++) {
        const float qi = q[i], vi = x->v[i], sai = sa[i], dyi = dy_t[i];
        vfloat g[MAX_V];
        #pragma GCC unroll 16
        for (int64_t c = 0; c < V; c++) {
            const vfloat Si = LOADV(S + i * NP + c * VEC);
            g[c] = LOADV(G + i * NP + c * VEC);
            gs[c] += g[c] * Si;
            g_v[c] += g[c] * vi;
            g_sa[c] += g[c] * sai;
            s_q[c] += Si * qi;
            s_dy[c] += Si * dyi;
            g[c] = LOADV(x->w + c * VEC) * g[c] + qi * LOADV(x->a + c * VEC);
        }
        #pragma GCC unroll 16
        for (int64_t c = 0; c < V; c++)
            STOREV(G + i * NP + c * VEC, g[c]);
        if (t == 0)
            continue;
        /* the step before's G += dy r^T, q = G b, gv = G k, while the row is at hand */
        wkv7_add_output(V, g, dy_before[i], before, q_rows + bit_reversed[i % 16], gv_rows + bit_reversed[i % 16]);
        #pragma GCC unroll 16
        for (int64_t c = 0; c < V; c++)
            STOREV(G + i * NP + c * VEC, g[c]);
        if (i % 16 == 15) {
            STOREV(q + i - 15, sum_lanes(q_rows));
            STOREV(gv + i - 15, sum_lanes(gv_rows));
        }
    }
}

/* One step back, token t at offset off: dv_t = gv (the previous pass's G k), the rows' pass, then dr_t (expanded
 * as above), dlog_w_t, dk_t, da_t, db_t, NaN for a head that met a non-finite input (bad). */
static inline __attribute__((always_inline)) void wkv7_backward_token(
    int64_t t, int64_t off, int64_t H, int64_t N, int64_t NP, int32_t bad, const float *r, const float *log_w,
    const float *k, const float *v, const float *a, const float *b, const float *dy, const float *S,
    const float *sa, float *pad, float *pad_before, struct wkv7_token *x, struct wkv7_token *before, float *G,
    float *q, float *gv, vfloat *q_rows, vfloat *gv_rows, float *dr, float *dlog_w, float *dk, float *dv,
    float *da, float *db)
{
    const int64_t V = NP / VEC;
    wkv7_load(N, NP, off, r, log_w, k, v, a, b, pad, x);
    const float *dy_t = padded(dy + off, N, NP, 0.0f, pad + 5 * NP);
    if (t > 0)
        wkv7_load(N, NP, off - H * N, r, log_w, k, v, a, b, pad_before, before);
    const float *dy_before = t > 0 ? padded(dy + off - H * N, N, NP, 0.0f, pad_before + 5 * NP) : NULL;
    float sa_dy = 0.0f, v_dy = 0.0f;
    for (int64_t i = 0; i < N; i++) {
        sa_dy += sa[i] * dy_t[i];
        v_dy += x->v[i] * dy_t[i];
        dv[off + i] = poison(gv[i], bad);
    }
    vfloat gs[MAX_V], g_v[MAX_V], g_sa[MAX_V], s_q[MAX_V], s_dy[MAX_V];
    wkv7_backward_rows(t, NP, S, sa, dy_t, dy_before, x, before, G, q, gv, q_rows, gv_rows, gs, g_v, g_sa, s_q,
                       s_dy);
    float out[5][MAX_V * VEC];
    #pragma GCC unroll 16
    for (int64_t c = 0; c < V; c++) {
        const vfloat w = LOADV(x->w + c * VEC);
        STOREV(out[0] + c * VEC, w * s_dy[c] + sa_dy * LOADV(x->b + c * VEC) + v_dy * LOADV(x->k + c * VEC));
        STOREV(out[1] + c * VEC, w * gs[c]);
        STOREV(out[2] + c * VEC, g_v[c]);
        STOREV(out[3] + c * VEC, s_q[c]);
        STOREV(out[4] + c * VEC, g_sa[c]);
    }
    for (int64_t j = 0; j < N; j++) {
        dr[off + j] = poison(out[0][j], bad);
        dlog_w[off + j] = poison(out[1][j], bad);
        dk[off + j] = poison(out[2][j], bad);
        da[off + j] = poison(out[3][j], bad);
        db[off + j] = poison(out[4][j], bad);
    }
}

static inline __attribute__((always_inline)) void wkv7_backward_item(
    int64_t item, int64_t T, int64_t H, int64_t N, int64_t NP, const float *r, const float *log_w, const float *k,
    const float *v, const float *a, const float *b, const float *dy, const float *dstate, int64_t ck,
    const float *ckpt, const int32_t *bad_in, float *dr, float *dlog_w, float *dk, float *dv, float *da, float *db,
    float *dstate0, float *G, float *history, float *sas, float *pad)
{
    const int64_t bi = item / H, h = item % H, n_ckpt = (T + ck - 1) / ck;
    const int32_t bad = bad_in[item];
    float q[MAX_V * VEC], gv[MAX_V * VEC];
    vfloat q_rows[16], gv_rows[16];                        /* 16 rows' partial sums, for sum_lanes */
    struct wkv7_token x = {0}, before = {0};                                /* step t's inputs, and step t - 1's */
    float *pad_before = pad + WKV7_PAD_BUFFERS * NP;
    wkv7_backward_start(item, T, H, N, NP, r, log_w, k, v, a, b, dy, dstate, G, pad, &x, q, gv, q_rows, gv_rows);
    for (int64_t chunk = n_ckpt - 1; chunk >= 0; chunk--) {
        const int64_t t0 = chunk * ck, L = T - t0 < ck ? T - t0 : ck;
        wkv7_chunk_rerun(item, T, H, N, NP, t0, L, ckpt + (item * n_ckpt + chunk) * NP * NP, r, log_w, k, v, a, b,
                         pad, &x, history, sas);
        for (int64_t l = L - 1; l >= 0; l--) {
            const int64_t t = t0 + l;
            wkv7_backward_token(t, ((bi * T + t) * H + h) * N, H, N, NP, bad, r, log_w, k, v, a, b, dy,
                                history + l * NP * NP, sas + l * NP, pad, pad_before, &x, &before, G, q, gv, q_rows,
                                gv_rows, dr, dlog_w, dk, dv, da, db);
        }
    }
    for (int64_t i = 0; i < N; i++)
        for (int64_t j = 0; j < N; j++)
            dstate0[(item * N + i) * N + j] = poison(G[i * NP + j], bad);
}

int wkv7_backward(int64_t first, int64_t last, int64_t T, int64_t H, int64_t N,
                   const float *r, const float *log_w, const float *k, const float *v, const float *a,
                   const float *b, const float *dy, const float *dstate, int64_t ck, const float *ckpt,
                   const int32_t *bad, float *dr, float *dlog_w, float *dk, float *dv, float *da, float *db,
                   float *dstate0)
{
    if (N > MAX_V * VEC)      /* kernels/wkv7/ sends larger heads to torch */
        return STATUS_HEAD_SIZE;
    const int64_t NP = wkv7_padded_size(N);
    /* G, the re-run states and the rest, each VEC floats off the one before: G's rows would otherwise lie a
     * multiple of 4 KiB from the states' rows read beside them, and the loads wait on the stores (4K aliasing:
     * 10 -> 7.5 ms measured) */
    float *G = scratch_floats((ck + 2) * NP * NP + ck * NP + 2 * WKV7_PAD_BUFFERS * NP + 2 * VEC);
    if (!G)
        return STATUS_NO_MEMORY;
    float *history = G + NP * NP + VEC, *sas = history + (ck + 1) * NP * NP + VEC, *pad = sas + ck * NP;
    for (int64_t item = first; item < last; item++) {
        if (N == 32)
            wkv7_backward_item(item, T, H, 32, 32, r, log_w, k, v, a, b, dy, dstate, ck, ckpt, bad, dr, dlog_w, dk,
                               dv, da, db, dstate0, G, history, sas, pad);
        else if (N == 64)
            wkv7_backward_item(item, T, H, 64, 64, r, log_w, k, v, a, b, dy, dstate, ck, ckpt, bad, dr, dlog_w, dk,
                               dv, da, db, dstate0, G, history, sas, pad);
        else
            wkv7_backward_item(item, T, H, N, NP, r, log_w, k, v, a, b, dy, dstate, ck, ckpt, bad, dr, dlog_w, dk,
                               dv, da, db, dstate0, G, history, sas, pad);
    }
    free(G);
    return STATUS_OK;
}
