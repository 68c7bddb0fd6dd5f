/* Prefill attention over float32 or bfloat16 queries, keys and values on x86 CPUs with AVX-512
   (and AVX512_BF16 for bfloat16).

   For each (sequence, head) pair and each block of ROWS query rows:
   1. scores = q k^T * scale in float32. In bfloat16, VDPBF16PS multiplies bfloat16 pairs
      exactly and adds them in float32: the float32 scores of these inputs at twice the rate of
      float32 multiply-adds;
   2. softmax in float32 (max, exp, sum over the row), kept in the core's L2 cache;
   3. out = probabilities (float32) times values (bfloat16 widened exactly to float32) with
      float32 multiply-adds; bfloat16 output is rounded once, at the end.
   The result is the float32 computation on the same inputs up to the order of its sums; every
   pair is computed alone, whatever else its call holds. The head size is HEAD (64: Whisper,
   BART, mBART, Marian, PEGASUS). */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#define HEAD 64
#define PAIRS (HEAD / 2)   /* bfloat16 pairs per head vector: one 32-bit lane each */
#define ROWS 24            /* query rows per block: their scores stay in the core's L2 cache */
#define KEY_CHUNK 64       /* keys per step of `probs_times_values`: their values stay in L1 */

/* exp(x) for x <= 0 (Cephes' expf polynomial, about 1 ulp); 0 below -87, where exp leaves
   float32's normal range. */
static inline __m512 exp_nonpositive(__m512 x) {
    __mmask16 zero = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_LT_OQ);
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_maskz_mov_ps(~zero, _mm512_scalef_ps(p, n));
}

/* Values as float32 rows of HEAD. */
static void widen_values(const void *v, int bf16, long v_stride, int keys, float *values) {
    for (int j = 0; j < keys; j++) {
        if (!bf16) {
            const float *row = (const float *)v + j * v_stride;
            for (int c = 0; c < HEAD; c += 16)
                _mm512_storeu_ps(values + (long)j * HEAD + c, _mm512_loadu_ps(row + c));
            continue;
        }
        const uint16_t *row = (const uint16_t *)v + j * v_stride;
        for (int c = 0; c < HEAD; c += 16) {
            __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(row + c)));
            _mm512_storeu_ps(values + (long)j * HEAD + c, _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16)));
        }
    }
}

/* Keys transposed for the score tiles, zeros past `keys`: bfloat16 keys as [PAIRS][padded_keys]
   32-bit lanes (one bfloat16 pair of one key each), float32 keys as [HEAD][padded_keys]. */
static void transpose_keys(const void *k, int bf16, long k_stride, int keys, int padded_keys,
                           uint32_t *packed) {
    int lanes = bf16 ? PAIRS : HEAD;
    for (int d = 0; d < lanes; d++) {
        uint32_t *row = packed + (long)d * padded_keys;
        for (int j = 0; j < keys; j++)
            row[j] = ((const uint32_t *)((const char *)k + j * k_stride * (bf16 ? 2 : 4)))[d];
        for (int j = keys; j < padded_keys; j++) row[j] = 0;
    }
}

/* scores[r][j] = (q_r . k_j) * scale for `rows` query rows and all padded keys, in tiles of
   8 rows x 32 keys: each step multiplies one 32-bit lane of 8 query rows (a bfloat16 pair, or one
   float32) with that lane of 32 keys. */
static void scores_of(const void *q, int bf16, long q_stride, int rows, const uint32_t *packed,
                      int padded_keys, float scale, float *scores) {
    const __m512 vscale = _mm512_set1_ps(scale);
    int lanes = bf16 ? PAIRS : HEAD;
    for (int t = 0; t < rows; t += 8) {
        int tile_rows = rows - t < 8 ? rows - t : 8;
        const uint32_t *qr[8];
        for (int r = 0; r < 8; r++)
            qr[r] = (const uint32_t *)((const char *)q + (t + (r < tile_rows ? r : 0)) * q_stride * (bf16 ? 2 : 4));
        for (int j = 0; j < padded_keys; j += 32) {
            __m512 acc[8][2];
            for (int r = 0; r < 8; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
            if (bf16) {
                for (int d = 0; d < lanes; d++) {
                    __m512bh k0 = (__m512bh)_mm512_loadu_si512(packed + (long)d * padded_keys + j);
                    __m512bh k1 = (__m512bh)_mm512_loadu_si512(packed + (long)d * padded_keys + j + 16);
                    for (int r = 0; r < 8; r++) {
                        __m512bh qd = (__m512bh)_mm512_set1_epi32((int)qr[r][d]);
                        acc[r][0] = _mm512_dpbf16_ps(acc[r][0], qd, k0);
                        acc[r][1] = _mm512_dpbf16_ps(acc[r][1], qd, k1);
                    }
                }
            } else {
                for (int d = 0; d < lanes; d++) {
                    __m512 k0 = _mm512_loadu_ps((const float *)packed + (long)d * padded_keys + j);
                    __m512 k1 = _mm512_loadu_ps((const float *)packed + (long)d * padded_keys + j + 16);
                    for (int r = 0; r < 8; r++) {
                        __m512 qd = _mm512_set1_ps(((const float *)qr[r])[d]);
                        acc[r][0] = _mm512_fmadd_ps(qd, k0, acc[r][0]);
                        acc[r][1] = _mm512_fmadd_ps(qd, k1, acc[r][1]);
                    }
                }
            }
            for (int r = 0; r < tile_rows; r++) {
                _mm512_storeu_ps(scores + (long)(t + r) * padded_keys + j, _mm512_mul_ps(acc[r][0], vscale));
                _mm512_storeu_ps(scores + (long)(t + r) * padded_keys + j + 16, _mm512_mul_ps(acc[r][1], vscale));
            }
        }
    }
}

/* Each row's scores over its first `keys` columns become exp(score - max); returns 1 / sum in
   `inverse_sums`. */
static void softmax_rows(float *scores, int rows, int keys, int padded_keys, float *inverse_sums) {
    int full = keys & ~15;
    __mmask16 tail = (__mmask16)((1u << (keys & 15)) - 1);
    for (int r = 0; r < rows; r++) {
        float *row = scores + (long)r * padded_keys;
        __m512 m = _mm512_set1_ps(-INFINITY);
        for (int j = 0; j < full; j += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(row + j));
        if (tail) m = _mm512_mask_max_ps(m, tail, m, _mm512_loadu_ps(row + full));
        __m512 max = _mm512_set1_ps(_mm512_reduce_max_ps(m));
        __m512 sum = _mm512_setzero_ps();
        for (int j = 0; j < full; j += 16) {
            __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(row + j), max));
            sum = _mm512_add_ps(sum, e);
            _mm512_storeu_ps(row + j, e);
        }
        if (tail) {
            __m512 e = _mm512_maskz_mov_ps(tail, exp_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(row + full), max)));
            sum = _mm512_add_ps(sum, e);
            _mm512_storeu_ps(row + full, e);
        }
        inverse_sums[r] = 1.0f / _mm512_reduce_add_ps(sum);
    }
}

/* out[r] = inverse_sums[r] * sum_j probs[r][j] values[j] (float32, or rounded to bfloat16), in
   tiles of 6 rows x HEAD over chunks of KEY_CHUNK keys. */
static void probs_times_values(const float *probs, int rows, int keys, int padded_keys,
                               const float *values, const float *inverse_sums, void *out,
                               int bf16, long out_stride) {
    float sums[ROWS][HEAD];
    for (int j0 = 0; j0 < keys; j0 += KEY_CHUNK) {
        int j1 = j0 + KEY_CHUNK < keys ? j0 + KEY_CHUNK : keys;
        for (int t = 0; t < rows; t += 6) {
            int tile_rows = rows - t < 6 ? rows - t : 6;
            __m512 acc[6][4];
            const float *pr[6];
            for (int r = 0; r < 6; r++) {
                int row = t + (r < tile_rows ? r : 0);
                pr[r] = probs + (long)row * padded_keys;
                for (int c = 0; c < 4; c++)
                    acc[r][c] = j0 ? _mm512_loadu_ps(sums[row] + 16 * c) : _mm512_setzero_ps();
            }
            for (int j = j0; j < j1; j++) {
                const float *vj = values + (long)j * HEAD;
                __m512 v0 = _mm512_loadu_ps(vj), v1 = _mm512_loadu_ps(vj + 16);
                __m512 v2 = _mm512_loadu_ps(vj + 32), v3 = _mm512_loadu_ps(vj + 48);
                for (int r = 0; r < 6; r++) {
                    __m512 p = _mm512_set1_ps(pr[r][j]);
                    acc[r][0] = _mm512_fmadd_ps(p, v0, acc[r][0]);
                    acc[r][1] = _mm512_fmadd_ps(p, v1, acc[r][1]);
                    acc[r][2] = _mm512_fmadd_ps(p, v2, acc[r][2]);
                    acc[r][3] = _mm512_fmadd_ps(p, v3, acc[r][3]);
                }
            }
            for (int r = 0; r < tile_rows; r++)
                for (int c = 0; c < 4; c++) _mm512_storeu_ps(sums[t + r] + 16 * c, acc[r][c]);
        }
    }
    for (int r = 0; r < rows; r++) {
        __m512 w = _mm512_set1_ps(inverse_sums[r]);
        for (int c = 0; c < HEAD; c += 32) {
            __m512 low = _mm512_mul_ps(_mm512_loadu_ps(sums[r] + c), w);
            __m512 high = _mm512_mul_ps(_mm512_loadu_ps(sums[r] + c + 16), w);
            if (bf16) {
                _mm512_storeu_si512((uint16_t *)out + r * out_stride + c, (__m512i)_mm512_cvtne2ps_pbh(high, low));
            } else {
                _mm512_storeu_ps((float *)out + r * out_stride + c, low);
                _mm512_storeu_ps((float *)out + r * out_stride + c + 16, high);
            }
        }
    }
}

/* Attention of pairs [first, last) of a (sequence, head) grid of `heads` heads, in float32 or
   bfloat16 (`bf16`). Sequence s has q_lens[s] query tokens from token q_starts[s] and kv_lens[s]
   key/value tokens from kv_starts[s]; token rows of q, k, v and out are *_stride elements apart,
   head h's vector starts at h * HEAD. Returns 0, or -1 where scratch memory could not be had. */
int attend(int bf16, int heads, const int64_t *q_starts, const int64_t *q_lens,
           const int64_t *kv_starts, const int64_t *kv_lens, const void *q, long q_stride,
           const void *k, long k_stride, const void *v, long v_stride, float scale, void *out,
           long out_stride, int first, int last) {
    long size = bf16 ? 2 : 4;
    int most_keys = 0;
    for (int p = first; p < last; p++)
        if (kv_lens[p / heads] > most_keys) most_keys = (int)kv_lens[p / heads];
    int padded = (most_keys + 31) & ~31;
    uint32_t *packed = aligned_alloc(64, (size_t)HEAD * padded * 4 + 64);
    float *values = aligned_alloc(64, (size_t)padded * HEAD * 4 + 64);
    float *scores = aligned_alloc(64, (size_t)ROWS * padded * 4 + 64);
    int status = packed && values && scores ? 0 : -1;
    for (int p = first; p < last && status == 0; p++) {
        int s = p / heads, h = p % heads, queries = (int)q_lens[s], keys = (int)kv_lens[s];
        int padded_keys = (keys + 31) & ~31;
        transpose_keys((const char *)k + (kv_starts[s] * k_stride + h * HEAD) * size, bf16,
                       k_stride, keys, padded_keys, packed);
        widen_values((const char *)v + (kv_starts[s] * v_stride + h * HEAD) * size, bf16,
                     v_stride, keys, values);
        for (int r0 = 0; r0 < queries; r0 += ROWS) {
            int rows = queries - r0 < ROWS ? queries - r0 : ROWS;
            long q_row = q_starts[s] + r0;
            float inverse_sums[ROWS];
            scores_of((const char *)q + (q_row * q_stride + h * HEAD) * size, bf16, q_stride,
                      rows, packed, padded_keys, scale, scores);
            softmax_rows(scores, rows, keys, padded_keys, inverse_sums);
            probs_times_values(scores, rows, keys, padded_keys, values, inverse_sums,
                               (char *)out + (q_row * out_stride + h * HEAD) * size, bf16,
                               out_stride);
        }
    }
    free(packed);
    free(values);
    free(scores);
    return status;
}
