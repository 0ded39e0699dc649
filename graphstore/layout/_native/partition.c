/* The stream partitioner's per-row work, without the GIL and without sorting.
 *
 * Plain C99 with no Python headers, loaded with ctypes by partition.py beside this
 * file; graphstore/layout/partition.py states the algorithm and keeps a numpy path that
 * computes the same results. In numpy every label-propagation pass summed each row's edge
 * weight per neighbouring label by building a scipy CSR whose columns were the labels and
 * sorting it (csr_sort_indices was a quarter of the partitioner's time), and each level's
 * blocks were built by scipy's coo -> csr with another sort. Here a row's weights per label
 * are summed in a small open-addressing table, and a block's CSR is a counting sort by row
 * (the input level's rows stay as they arrive; a coarser level's duplicates are merged in
 * the same kind of table).
 *
 * Results equal numpy's bit for bit: weights are sums of integers (1 an entry at the
 * input level, summed multiplicities above it), exact in float64, so neither the order of
 * summation nor the order of a row's entries matters; scores are the same two float64
 * additions (the build is ISO C: no contraction into fused multiply-adds), and ties go to
 * the smallest label, as numpy's first-in-ascending-order does.
 */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(_WIN32)
#define GS_EXPORT __declspec(dllexport)
#else
#define GS_EXPORT __attribute__((visibility("default")))
#endif

enum { GS_OK = 0, GS_NO_MEMORY = -1, GS_TOO_MANY = -2 };

/* 2: the input level's entries carry no weights (data NULL: 1 each, duplicates repeated)
 * and a block's rows are no longer sorted. 3: gs_part_csr reads strided entries. */
GS_EXPORT int32_t gs_part_abi_version(void) { return 3; }

/* ------------------------------------------------------------------ per-row sums by label */

/* Open addressing over int32 labels (-1: empty), sized for one row at a time; only the
 * slots a row used are cleared after it. */
typedef struct {
    int32_t *key;
    double *sum;
    int32_t *used; /* slots in first-touch order */
    int64_t mask;  /* capacity - 1, capacity a power of two */
    int64_t count;
} table_t;

static int table_init(table_t *t, int64_t max_degree) {
    int64_t cap = 16;
    while (cap < 2 * max_degree) cap <<= 1;
    t->key = malloc(cap * sizeof(int32_t));
    t->sum = malloc(cap * sizeof(double));
    t->used = malloc(cap * sizeof(int32_t));
    if (!t->key || !t->sum || !t->used) {
        free(t->key); free(t->sum); free(t->used);
        return GS_NO_MEMORY;
    }
    memset(t->key, 0xff, cap * sizeof(int32_t));
    t->mask = cap - 1;
    t->count = 0;
    return GS_OK;
}

static void table_free(table_t *t) { free(t->key); free(t->sum); free(t->used); }

static inline void table_add(table_t *t, int32_t label, double w) {
    int64_t slot = (int64_t)(((uint32_t)label * 0x9E3779B1u) & (uint32_t)t->mask);
    while (t->key[slot] != -1 && t->key[slot] != label) slot = (slot + 1) & t->mask;
    if (t->key[slot] == -1) {
        t->key[slot] = label;
        t->sum[slot] = 0.0;
        t->used[t->count++] = (int32_t)slot;
    }
    t->sum[slot] += w;
}

static inline void table_clear(table_t *t) {
    for (int64_t i = 0; i < t->count; i++) t->key[t->used[i]] = -1;
    t->count = 0;
}

static int64_t max_row_degree(int64_t rows, const int32_t *indptr) {
    int64_t most = 0;
    for (int64_t r = 0; r < rows; r++) {
        int64_t d = (int64_t)indptr[r + 1] - indptr[r];
        if (d > most) most = d;
    }
    return most;
}

static inline int32_t label_at(const void *labels, int32_t bytes, int64_t i) {
    return bytes == 2 ? (int32_t)((const int16_t *)labels)[i] : ((const int32_t *)labels)[i];
}

/* The label gathers jump all over [n] (the rows' neighbours are random ids), one cache
 * miss each once the labels outgrow the cache: ask for the one PREFETCH entries ahead
 * while this one is summed. */
#define PREFETCH 16
#if defined(__GNUC__) || defined(__clang__)
#define GS_PREFETCH(address) __builtin_prefetch((address), 0, 1)
#define GS_PREFETCH_WRITE(address) __builtin_prefetch((address), 1, 1)
#else
#define GS_PREFETCH(address) ((void)0)
#define GS_PREFETCH_WRITE(address) ((void)0)
#endif

/* An entry's weight; data NULL: the input level, whose entries weigh 1 each (a duplicate
 * edge is its entries repeated). */
static inline double weight_at(const void *data, int32_t f64, int64_t i) {
    if (data == NULL) return 1.0;
    return f64 ? ((const double *)data)[i] : (double)((const float *)data)[i];
}

/* `_tie_break` of partition.py: the salted label's multiplicative hash, top 16 bits, in [0, 0.5). */
static inline double tie_break(int32_t label, uint32_t salt) {
    uint32_t mix = ((uint32_t)label ^ salt) * 0x9E3779B1u;
    mix >>= 16;
    return (double)mix * (0.5 / 65536.0);
}

/* Per row: its weight toward its own label, and the allowed other label of most weight
 * (ties: `tie_break`, then the smallest label); `_aggregate` then `_choose` in numpy.
 *
 * A label t is allowed for row r when every given test holds: mask[t] == mask_want;
 * load[t] + row_weight[r] <= (cap ? cap[t] : cap_scalar); row_flag[r] != 0. best[r] is -1
 * (best_weight 0) where none is. labels and own are int16 or int32 (label_bytes), load
 * int32 or int64 (load_bytes), data float32 or float64. */
GS_EXPORT int gs_part_choose(int64_t rows, const int32_t *indptr, const int32_t *indices, const void *data,
                             int32_t data_f64, const void *labels, int32_t label_bytes, const void *own,
                             uint32_t salt, const uint8_t *mask, int32_t mask_want, const void *load,
                             int32_t load_bytes, const int64_t *cap, int64_t cap_scalar,
                             const int64_t *row_weight, const uint8_t *row_flag, double *own_weight,
                             int64_t *best, double *best_weight) {
    table_t t;
    if (table_init(&t, max_row_degree(rows, indptr)) != GS_OK) return GS_NO_MEMORY;
    const int64_t total = indptr[rows];
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t e = indptr[r]; e < indptr[r + 1]; e++) {
            if (e + PREFETCH < total)
                GS_PREFETCH((const char *)labels + (int64_t)indices[e + PREFETCH] * label_bytes);
            table_add(&t, label_at(labels, label_bytes, indices[e]), weight_at(data, data_f64, e));
        }
        int32_t mine = label_at(own, label_bytes, r);
        int flagged = row_flag == NULL || row_flag[r] != 0;
        double mine_w = 0.0, top = -1.0, top_w = 0.0;
        int64_t top_label = -1;
        for (int64_t i = 0; i < t.count; i++) {
            int64_t slot = t.used[i];
            int32_t label = t.key[slot];
            double w = t.sum[slot];
            if (label == mine) {
                mine_w = w;
                continue;
            }
            if (!flagged) continue;
            if (mask != NULL && (mask[label] != 0) != (mask_want != 0)) continue;
            if (load != NULL) {
                int64_t have = load_bytes == 4 ? (int64_t)((const int32_t *)load)[label]
                                               : ((const int64_t *)load)[label];
                if (have + row_weight[r] > (cap != NULL ? cap[label] : cap_scalar)) continue;
            }
            double score = tie_break(label, salt);
            score += w;
            if (score > top || (score == top && label < top_label)) {
                top = score;
                top_label = label;
                top_w = w;
            }
        }
        own_weight[r] = mine_w;
        best[r] = top_label;
        best_weight[r] = top_label >= 0 ? top_w : 0.0;
        table_clear(&t);
    }
    table_free(&t);
    return GS_OK;
}

/* The coarser level's entries of rows [first, first + rows): per row, its cluster, each
 * other neighbouring cluster and the summed weight toward it (entries inside a cluster
 * dropped); `_contract`'s emit in numpy, in an order of its own (the level builder sums
 * and sorts them). Returns the number of entries written (at most indptr[rows]), or
 * GS_NO_MEMORY. */
GS_EXPORT int64_t gs_part_contract(int64_t rows, const int32_t *indptr, const int32_t *indices, const void *data,
                                   int32_t data_f64, const int32_t *cluster, int64_t first, int32_t *out_rows,
                                   int32_t *out_targets, double *out_weights) {
    table_t t;
    if (table_init(&t, max_row_degree(rows, indptr)) != GS_OK) return GS_NO_MEMORY;
    int64_t k = 0;
    const int64_t total = indptr[rows];
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t e = indptr[r]; e < indptr[r + 1]; e++) {
            if (e + PREFETCH < total) GS_PREFETCH(&cluster[indices[e + PREFETCH]]);
            table_add(&t, cluster[indices[e]], weight_at(data, data_f64, e));
        }
        int32_t mine = cluster[first + r];
        for (int64_t i = 0; i < t.count; i++) {
            int64_t slot = t.used[i];
            if (t.key[slot] == mine) continue;
            out_rows[k] = mine;
            out_targets[k] = t.key[slot];
            out_weights[k] = t.sum[slot];
            k++;
        }
        table_clear(&t);
    }
    table_free(&t);
    return k;
}

/* ------------------------------------------------------------------ the input level's entries */

/* A chunk of staged edges as level-0 entries grouped by row block: each edge (self loops
 * dropped) in both directions, in internal ids (order[source id]), as (column, row within
 * its block) int32 pairs; `_level_zero`'s prepare then `_LevelBuilder.prepare` in numpy.
 * Writes counts [num_blocks] and pairs [2 * kept edges, 2]; entries keep their chunk
 * order within a block (the level builder's CSR does not depend on it). Returns the
 * entries written, or GS_NO_MEMORY. */
GS_EXPORT int64_t gs_part_level_zero(int64_t m, const int64_t *src, const int64_t *dst, const int32_t *order,
                                     int64_t rows_per_block, int64_t num_blocks, int64_t *counts,
                                     int32_t *pairs) {
    int64_t *cursor = malloc((size_t)(num_blocks > 0 ? num_blocks : 1) * sizeof(int64_t));
    int32_t *ab = malloc((size_t)(m > 0 ? 2 * m : 2) * sizeof(int32_t));
    if (!cursor || !ab) {
        free(cursor); free(ab);
        return GS_NO_MEMORY;
    }
    memset(counts, 0, (size_t)num_blocks * sizeof(int64_t));
    int64_t kept = 0;
    for (int64_t i = 0; i < m; i++) {
        if (i + PREFETCH < m) {
            GS_PREFETCH(&order[src[i + PREFETCH]]);
            GS_PREFETCH(&order[dst[i + PREFETCH]]);
        }
        if (src[i] == dst[i]) continue;
        int32_t a = order[src[i]], b = order[dst[i]];
        ab[2 * kept] = a;
        ab[2 * kept + 1] = b;
        counts[a / rows_per_block]++;
        counts[b / rows_per_block]++;
        kept++;
    }
    int64_t sum = 0;
    for (int64_t blk = 0; blk < num_blocks; blk++) {
        cursor[blk] = sum;
        sum += counts[blk];
    }
    for (int64_t i = 0; i < kept; i++) {
        int32_t a = ab[2 * i], b = ab[2 * i + 1];
        int64_t ba = a / rows_per_block, bb = b / rows_per_block;
        int64_t at = cursor[ba]++;
        pairs[2 * at] = b;
        pairs[2 * at + 1] = (int32_t)(a - ba * rows_per_block);
        at = cursor[bb]++;
        pairs[2 * at] = a;
        pairs[2 * at + 1] = (int32_t)(b - bb * rows_per_block);
    }
    free(cursor); free(ab);
    return 2 * kept;
}

/* ------------------------------------------------------------------ a block's CSR */

/* CSR of m (row, column[, weight]) entries over num_rows rows, by a counting sort on the
 * row: that scatter is the cost, one cache miss an entry (the slot is prefetched).
 *
 * weights NULL (the input level): the entries grouped by row and nothing more, each row's
 * columns in arrival order, duplicates kept (each weighs 1; every consumer sums a row's
 * weights per label in a table, where a repeated entry adds what a merged one would), and
 * no data is written. Otherwise equal (row, column) entries are merged, weights summed,
 * in a table per row (columns distinct, in first-arrival order, not sorted: `_whole`
 * sorts the one level METIS reads); in and out float32 or float64 (w_f64, out_f64).
 * Entry i's row and column are rows[i * stride] and cols[i * stride] (stride 2: the
 * interleaved (column, row) pairs of a block's scratch file, read as they are). Writes
 * indptr [num_rows + 1], indices and data (at most m each); returns the entries kept,
 * GS_NO_MEMORY, or GS_TOO_MANY past 2**31 entries (the caller then uses scipy).
 * Before, each row was sorted to merge its duplicates: a third of the partitioner's CPU. */
GS_EXPORT int64_t gs_part_csr(int64_t m, const int32_t *rows, const int32_t *cols, int64_t stride,
                              const void *weights, int32_t w_f64, int64_t num_rows, int32_t out_f64,
                              int32_t *indptr, int32_t *indices, void *data) {
    if (m >= ((int64_t)1 << 31)) return GS_TOO_MANY;
    int64_t *start = calloc((size_t)num_rows + 2, sizeof(int64_t));
    if (!start) return GS_NO_MEMORY;
    /* start[r + 2] counts row r; after the prefix sum start[r + 1] is row r's first slot,
     * advanced by the scatter to its end, which is row r + 1's start. */
    for (int64_t i = 0; i < m; i++) start[rows[i * stride] + 2]++;
    for (int64_t r = 0; r < num_rows; r++) start[r + 2] += start[r + 1];
    if (weights == NULL) {
        /* Grouping alone: straight into the output. */
        for (int64_t i = 0; i < m; i++) {
            /* The slot PREFETCH entries ahead, as it stands now: right unless the rows
             * between share its row, when it is a slot or two short (a hint, never a read). */
            if (i + PREFETCH < m) GS_PREFETCH_WRITE(&indices[start[rows[(i + PREFETCH) * stride] + 1]]);
            indices[start[rows[i * stride] + 1]++] = cols[i * stride];
        }
        for (int64_t r = 0; r <= num_rows; r++) indptr[r] = (int32_t)start[r];
        free(start);
        return m;
    }
    int32_t *col = malloc((size_t)(m > 0 ? m : 1) * sizeof(int32_t));
    double *w = malloc((size_t)(m > 0 ? m : 1) * sizeof(double));
    if (!col || !w) {
        free(start); free(col); free(w);
        return GS_NO_MEMORY;
    }
    for (int64_t i = 0; i < m; i++) {
        if (i + PREFETCH < m) GS_PREFETCH_WRITE(&col[start[rows[(i + PREFETCH) * stride] + 1]]);
        int64_t at = start[rows[i * stride] + 1]++;
        col[at] = cols[i * stride];
        w[at] = weight_at(weights, w_f64, i);
    }
    int64_t most = 0;
    for (int64_t r = 0; r < num_rows; r++)
        if (start[r + 1] - start[r] > most) most = start[r + 1] - start[r];
    table_t t;
    if (table_init(&t, most) != GS_OK) {
        free(start); free(col); free(w);
        return GS_NO_MEMORY;
    }
    int64_t k = 0;
    indptr[0] = 0;
    for (int64_t r = 0; r < num_rows; r++) {
        for (int64_t e = start[r]; e < start[r + 1]; e++) table_add(&t, col[e], w[e]);
        for (int64_t i = 0; i < t.count; i++) {
            int64_t slot = t.used[i];
            indices[k] = t.key[slot];
            if (out_f64) ((double *)data)[k] = t.sum[slot];
            else ((float *)data)[k] = (float)t.sum[slot];
            k++;
        }
        table_clear(&t);
        indptr[r + 1] = (int32_t)k;
    }
    table_free(&t);
    free(start); free(col); free(w);
    return k;
}
