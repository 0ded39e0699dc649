/* The converter's edge phase in C: staged edges into sorted, merged buckets.
 *
 * Plain C99 with no Python headers, loaded with ctypes by graphstore/layout/_native/edges.py,
 * whose caller, graphstore/layout/_buckets.py, states the contract and keeps a numpy path
 * that writes the same bytes. In numpy the phase ran at 3-6M edges/s on one core: id-map
 * gathers through a memory map, an argsort and a pwrite per (chunk, partition) from Python,
 * then per destination partition a comparison sort of int64 keys, a mask, an np.add.at. Here
 * the same work is three calls that hold no GIL, so two of them can run at once:
 *
 *   gs_edges_pack_chunk    reads a chunk of staged edges (pread), maps both ends to store
 *                          ids, packs each edge into one 64-bit key and groups the keys by
 *                          destination partition (a counting sort);
 *   gs_edges_write_groups  appends each partition's keys at its cursor in the grouped file;
 *   gs_edges_sort_group    reads one destination partition's keys back, radix sorts them,
 *                          and in one pass merges duplicates, counts the merges, decodes the
 *                          keys into the stored columns and counts buckets and degrees.
 *
 * and, once the edges are in the store, the hub group's pass over them (gs_hub_segments).
 *
 * The key of an edge (s, d, r) in destination partition d / size, high bits first:
 *
 *     s / size   | d % size | s % size | r        | added
 *     sp_bits      b          b          rel_bits   1
 *
 * Its unsigned order is the store's bucket order (source partition, destination, source,
 * relation), and within equal edges the source's own before a reverse the converter added;
 * two edges are equal exactly when their keys agree above the added bit. b is the bit length
 * of size - 1, so fields are shifts and masks, not divisions; the caller checks the sum fits
 * in 64 bits (and uses numpy when it does not).
 */

#define _XOPEN_SOURCE 700 /* pread, pwrite, posix_fadvise */
#define _FILE_OFFSET_BITS 64 /* offsets past 2 GiB on 32-bit systems too */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#if defined(_WIN32)
#define GS_EXPORT __declspec(dllexport)
#else
#define GS_EXPORT __attribute__((visibility("default")))
#endif

#if defined(__GNUC__) || defined(__clang__)
#define GS_PREFETCH(p) __builtin_prefetch((const void *)(p), 0, 0)
#define GS_PREFETCH_W(p) __builtin_prefetch((const void *)(p), 1, 0)
#define GS_ATOMIC_ADD(p, v) __atomic_fetch_add((p), (v), __ATOMIC_RELAXED)
#define GS_HAVE_ATOMICS 1
#else
#define GS_PREFETCH(p) ((void)0)
#define GS_PREFETCH_W(p) ((void)0)
#define GS_ATOMIC_ADD(p, v) (*(p) += (v))
#define GS_HAVE_ATOMICS 0
#endif

enum { GS_OK = 0, GS_SHORT = 1, GS_IO_ERROR = 2 };

/* 3: gs_hub_segments. */
GS_EXPORT int32_t gs_edges_abi_version(void) { return 3; }

/* 1 when gs_edges_sort_group's out-degree increments are atomic, so that several groups
 * may be sorted at once; 0 (a compiler without atomics) means one at a time. */
GS_EXPORT int32_t gs_edges_threadsafe(void) { return GS_HAVE_ATOMICS; }

/* x / size and x % size for 0 <= x < 2^52 without a 64-bit division (20-40 cycles each, and
 * every edge needs two): the double quotient is off by at most one, which the remainder fixes. */
static inline int64_t divmod(int64_t x, int64_t size, double inverse, int64_t *rem) {
    int64_t q = (int64_t)((double)x * inverse);
    int64_t r = x - q * size;
    if (r < 0) { q--; r += size; }
    else if (r >= size) { q++; r -= size; }
    *rem = r;
    return q;
}

static inline int64_t load_id(const void *ids, int32_t id_bytes, int64_t i) {
    return id_bytes == 4 ? (int64_t)((const int32_t *)ids)[i] : ((const int64_t *)ids)[i];
}

static int read_full(int fd, void *buf, int64_t nbytes, int64_t offset, int32_t *err) {
    int64_t done = 0;
    while (done < nbytes) {
        ssize_t k = pread(fd, (char *)buf + done, (size_t)(nbytes - done), (off_t)(offset + done));
        if (k < 0) {
            if (errno == EINTR) continue;
            *err = errno;
            return GS_IO_ERROR;
        }
        if (k == 0) { *err = 0; return GS_SHORT; }
        done += k;
    }
    return GS_OK;
}

static int write_full(int fd, const void *buf, int64_t nbytes, int64_t offset, int32_t *err) {
    int64_t done = 0;
    while (done < nbytes) {
        ssize_t k = pwrite(fd, (const char *)buf + done, (size_t)(nbytes - done), (off_t)(offset + done));
        if (k < 0) {
            if (errno == EINTR) continue;
            *err = errno;
            return GS_IO_ERROR;
        }
        done += k;
    }
    return GS_OK;
}

/* ------------------------------------------------------------------ pass 1 */

enum { BLOCK = 1 << 16 }; /* edges read per pread: 512 KiB a column */

/* Pack staged rows [start, start + m) into keys grouped by destination partition.
 *
 * src_fd, dst_fd, rel_fd (-1: no relations): the staged columns, endpoints of staged_bytes
 * (4 or 8) each, relations int64. runs [num_runs, 2]:
 * ascending disjoint [start, stop) row ranges of added reverse edges. store_id: [N] ids of
 * id_bytes (4 or 8). io: 3 * BLOCK int64 of scratch; part: [m] int32 and keys: [m] uint64 of
 * scratch. Out: grouped [m] uint64, partition j's keys (in row order) at
 * grouped[sum(counts[:j])...]; counts [p] int64, zeroed here.
 * Returns GS_OK, or GS_SHORT / GS_IO_ERROR with *bad_fd the file and *err its errno. */
GS_EXPORT int gs_edges_pack_chunk(int32_t src_fd, int32_t dst_fd, int32_t rel_fd, int32_t staged_bytes,
                                  int64_t start, int64_t m, const int64_t *runs, int64_t num_runs, const void *store_id, int32_t id_bytes,
                                  int64_t size, int64_t p, int32_t b, int32_t rel_bits, int64_t *io, int32_t *part,
                                  uint64_t *keys, uint64_t *grouped, int64_t *counts, int32_t *bad_fd, int32_t *err) {
    const double inverse = 1.0 / (double)size;
    const int sl_shift = rel_bits + 1, dl_shift = b + rel_bits + 1, sp_shift = 2 * b + rel_bits + 1;
    void *src = io, *dst = io + BLOCK;
    int64_t *rel = io + 2 * BLOCK;
    int64_t run = 0;
    memset(counts, 0, (size_t)p * sizeof(int64_t));
    while (run < num_runs && runs[2 * run + 1] <= start) run++;
    for (int64_t lo = 0; lo < m; lo += BLOCK) {
        int64_t n = m - lo < BLOCK ? m - lo : BLOCK, off = (start + lo) * staged_bytes;
        int status;
        if ((status = read_full(src_fd, src, n * staged_bytes, off, err))) { *bad_fd = src_fd; return status; }
        if ((status = read_full(dst_fd, dst, n * staged_bytes, off, err))) { *bad_fd = dst_fd; return status; }
        if (rel_fd >= 0 && (status = read_full(rel_fd, rel, n * 8, (start + lo) * 8, err))) {
            *bad_fd = rel_fd;
            return status;
        }
        for (int64_t i = 0; i < n; i++) {
            /* The id maps are [N] arrays read at random: ask for the lines ahead of use. */
            if (i + 16 < n) {
                GS_PREFETCH((const char *)store_id + load_id(src, staged_bytes, i + 16) * id_bytes);
                GS_PREFETCH((const char *)store_id + load_id(dst, staged_bytes, i + 16) * id_bytes);
            }
            int64_t row = start + lo + i;
            while (run < num_runs && runs[2 * run + 1] <= row) run++;
            uint64_t added = run < num_runs && runs[2 * run] <= row;
            int64_t sl, dl;
            int64_t sp = divmod(load_id(store_id, id_bytes, load_id(src, staged_bytes, i)), size, inverse, &sl);
            int64_t dp = divmod(load_id(store_id, id_bytes, load_id(dst, staged_bytes, i)), size, inverse, &dl);
            uint64_t key = (uint64_t)sp << sp_shift | (uint64_t)dl << dl_shift | (uint64_t)sl << sl_shift | added;
            if (rel_fd >= 0) key |= (uint64_t)rel[i] << 1;
            keys[lo + i] = key;
            part[lo + i] = (int32_t)dp;
            counts[dp]++;
        }
    }
    /* The counting sort's scatter, with the counts turned into starts and back. */
    int64_t total = 0;
    for (int64_t j = 0; j < p; j++) { int64_t c = counts[j]; counts[j] = total; total += c; }
    for (int64_t i = 0; i < m; i++) grouped[counts[part[i]]++] = keys[i];
    for (int64_t j = p - 1; j > 0; j--) counts[j] -= counts[j - 1];
    return GS_OK;
}

/* Write partition j's keys (counts[j] of them, partitions in order in grouped) at element
 * cursor[j] of fd, and advance cursor[j]. Returns GS_OK or GS_IO_ERROR with *err. */
GS_EXPORT int gs_edges_write_groups(int32_t fd, const uint64_t *grouped, const int64_t *counts, int64_t *cursor,
                                    int64_t p, int32_t *err) {
    int64_t first = 0;
    for (int64_t j = 0; j < p; j++) {
        if (!counts[j]) continue;
        int status = write_full(fd, grouped + first, counts[j] * 8, cursor[j] * 8, err);
        if (status) return status;
        cursor[j] += counts[j];
        first += counts[j];
    }
    return GS_OK;
}

/* ------------------------------------------------------------------ pass 2 */

enum { DIGIT = 11, BUCKETS = 1 << DIGIT };

/* LSD radix sort of keys[m] (their low key_bits) using tmp[m]; returns the array that holds
 * the result (keys or tmp). One read builds every digit's histogram; a digit all keys share
 * costs no pass (the top digit often, a small partition's fields always). */
static uint64_t *radix_sort(uint64_t *keys, uint64_t *tmp, int64_t m, int32_t key_bits) {
    enum { MAX_DIGITS = (64 + DIGIT - 1) / DIGIT };
    int digits = (key_bits + DIGIT - 1) / DIGIT;
    if (digits < 1 || m < 2) return keys;
    uint32_t hist[MAX_DIGITS][BUCKETS];
    memset(hist, 0, sizeof(uint32_t) * (size_t)digits * BUCKETS);
    for (int64_t i = 0; i < m; i++) {
        uint64_t k = keys[i];
        for (int t = 0; t < digits; t++) hist[t][(k >> (t * DIGIT)) & (BUCKETS - 1)]++;
    }
    uint64_t *from = keys, *to = tmp;
    for (int t = 0; t < digits; t++) {
        uint32_t *h = hist[t];
        if (h[(from[0] >> (t * DIGIT)) & (BUCKETS - 1)] == (uint64_t)m) continue;
        uint64_t pos[BUCKETS], sum = 0;
        for (int c = 0; c < BUCKETS; c++) { pos[c] = sum; sum += h[c]; }
        const int shift = t * DIGIT;
        for (int64_t i = 0; i < m; i++) {
            uint64_t k = from[i];
            to[pos[(k >> shift) & (BUCKETS - 1)]++] = k;
        }
        uint64_t *swap = from; from = to; to = swap;
    }
    return from;
}

/* Sort destination partition `first / size`'s keys, merge duplicates, decode, count.
 *
 * Reads m keys from element `offset` of fd (then drops them from the page cache) into
 * keys [m]; tmp [m] is scratch. Writes the stored edges into out_s, out_d ([m] of id_bytes
 * each) and out_rel ([m] int32, or NULL without relations); adds each stored edge to
 * bucket_sizes[s / size] ([p] int64, zeroed by the caller), in_degree[d - first] ([size]
 * int64, this partition's slice) and out_degree[s] ([N] int64, shared: atomic increments).
 * merge [4] int64 receives (duplicates, duplicates_merged, reverse_edges_present,
 * reverse_edges_added) as graphstore.layout._buckets._merge_counts defines them.
 * *stored = edges written. Returns GS_OK, or GS_SHORT / GS_IO_ERROR with *err. */
GS_EXPORT int gs_edges_sort_group(int32_t fd, int64_t offset, int64_t m, uint64_t *keys, uint64_t *tmp,
                                  int32_t key_bits, int64_t size, int64_t first, int32_t b, int32_t rel_bits,
                                  int32_t keep_duplicates, void *out_s, void *out_d, int32_t *out_rel,
                                  int32_t id_bytes, int64_t *bucket_sizes, int64_t *in_degree,
                                  int64_t *out_degree, int64_t *merge, int64_t *stored, int32_t *err) {
    int status = read_full(fd, keys, m * 8, offset * 8, err);
    if (status) return status;
#if defined(POSIX_FADV_DONTNEED)
    (void)posix_fadvise(fd, (off_t)(offset * 8), (off_t)(m * 8), POSIX_FADV_DONTNEED);
#endif
    const uint64_t *sorted = radix_sort(keys, tmp, m, key_bits);
    const int sl_shift = rel_bits + 1, dl_shift = b + rel_bits + 1, sp_shift = 2 * b + rel_bits + 1;
    const uint64_t field = ((uint64_t)1 << b) - 1, rel_mask = ((uint64_t)1 << rel_bits) - 1;
    int64_t given = 0, new_given = 0, present = 0, new_added = 0, out = 0;
    uint64_t previous = 0;
    int previous_given = 0;
    for (int64_t i = 0; i < m; i++) {
        /* out_degree is [N] and hit at random: fetch the line 32 edges ahead (halves the
         * pass on 7.3M nodes). */
        if (i + 32 < m) {
            uint64_t ahead = sorted[i + 32];
            GS_PREFETCH_W(out_degree + (int64_t)(ahead >> sp_shift) * size + (int64_t)((ahead >> sl_shift) & field));
        }
        uint64_t k = sorted[i], edge = k >> 1;
        int added = (int)(k & 1), is_new = i == 0 || edge != previous;
        given += !added;
        new_given += is_new && !added;
        new_added += is_new && added;
        /* A run of equal edges holds its source edges first: one step from a source edge to
         * an added one inside a run means the source listed this reverse itself. */
        present += !is_new && added && previous_given;
        previous = edge;
        previous_given = !added;
        if (!is_new && !keep_duplicates) continue;
        int64_t sp = (int64_t)(k >> sp_shift), dl = (int64_t)((k >> dl_shift) & field);
        int64_t s = sp * size + (int64_t)((k >> sl_shift) & field), d = first + dl;
        if (id_bytes == 4) {
            ((int32_t *)out_s)[out] = (int32_t)s;
            ((int32_t *)out_d)[out] = (int32_t)d;
        } else {
            ((int64_t *)out_s)[out] = s;
            ((int64_t *)out_d)[out] = d;
        }
        if (out_rel) out_rel[out] = (int32_t)((k >> 1) & rel_mask);
        out++;
        bucket_sizes[sp]++;
        in_degree[dl]++;
        GS_ATOMIC_ADD(&out_degree[s], 1);
    }
    int64_t duplicates = given - new_given;
    merge[0] = duplicates;
    merge[1] = keep_duplicates ? 0 : duplicates;
    merge[2] = present;
    merge[3] = keep_duplicates ? m - given : new_added;
    *stored = out;
    return GS_OK;
}

/* ------------------------------------------------------------------ the hub group's segments */

static inline int64_t id_at(const void *ids, int32_t bytes, int64_t i) {
    return bytes == 4 ? (int64_t)((const int32_t *)ids)[i] : ((const int64_t *)ids)[i];
}

/* The hub group's pass over a chunk of stored edges (`graphstore.layout._hubs`): each edge
 * with a hub end (is_hub[src] or is_hub[dst]) belongs to the segment of its other end's
 * partition (id / partition_size), or to segment p when both ends are hubs. With counts
 * ([p + 1]), each segment's edges are added to it. With cursor ([p + 1]), each such edge's
 * src, dst and (rel != NULL) rel are written at row cursor[segment]++ of out_src, out_dst,
 * out_rel, edges in chunk order: the scatter of a stable counting sort by segment, what
 * numpy's stable argsort then fancy assignment wrote. ids are int32 or int64 (id_bytes),
 * relations rel_bytes wide. One pass and one is_hub lookup per end, where numpy made a
 * dozen passes over the chunk. A cursor reaching its segment's end ([p + 1]; the edges
 * changed since they were counted) stops the pass before writing: returns -1. Else returns
 * the edges with a hub end. */
GS_EXPORT int64_t gs_hub_segments(int64_t m, const void *src, const void *dst, int32_t id_bytes,
                                  const uint8_t *is_hub, int64_t partition_size, int64_t p, int64_t *counts,
                                  int64_t *cursor, const int64_t *end, void *out_src, void *out_dst,
                                  const void *rel, void *out_rel, int32_t rel_bytes) {
    int64_t touched = 0;
    for (int64_t i = 0; i < m; i++) {
        int64_t s = id_at(src, id_bytes, i), d = id_at(dst, id_bytes, i);
        int hs = is_hub[s] != 0, hd = is_hub[d] != 0;
        if (!hs && !hd) continue;
        int64_t segment = hs && hd ? p : (hs ? d : s) / partition_size;
        touched++;
        if (counts) counts[segment]++;
        if (cursor) {
            if (cursor[segment] >= end[segment]) return -1;
            int64_t at = cursor[segment]++;
            memcpy((char *)out_src + at * id_bytes, (const char *)src + i * id_bytes, (size_t)id_bytes);
            memcpy((char *)out_dst + at * id_bytes, (const char *)dst + i * id_bytes, (size_t)id_bytes);
            if (rel)
                memcpy((char *)out_rel + at * rel_bytes, (const char *)rel + i * rel_bytes, (size_t)rel_bytes);
        }
    }
    return touched;
}
