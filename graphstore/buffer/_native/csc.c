/* The resident graph's CSC built from its edge parts in two passes of C: a counting sort.
 *
 * Plain C99 with no Python headers, loaded with ctypes by graphstore/buffer/_native/__init__.py,
 * the only caller, which states the contract. `graphstore.buffer.resident` assembles a state's
 * graph from its edge buckets (store ids shifted to buffer rows by a constant per side) and
 * its static-cache edges (already in local ids). In numpy that took concatenating every part
 * into int64 arrays, a stable argsort by destination and a gather: about 0.3 s and 40 bytes
 * of temporaries per edge for the 8M edges of 7 resident partitions, on the loader thread,
 * beside training on the same cores. Here:
 *   pass 1  counts each destination's in-edges into indptr[v + 1] (and checks every id);
 *   pass 2  turns the counts into starts and writes each edge at its destination's cursor,
 *           parts in the given order and edges in their order within a part, so the result
 *           is exactly what a stable sort by destination gives (the order the samplers rely
 *           on: within a destination, the parts' order, then each part's own order);
 *   then    shifts the cursors (which end at the next destination's start) back into indptr.
 * No scratch beyond the outputs. ctypes releases the GIL for the call.
 */

#include <stdint.h>
#include <string.h>

#if defined(_WIN32)
#define GS_EXPORT __declspec(dllexport)
#else
#define GS_EXPORT __attribute__((visibility("default")))
#endif

enum { GS_OK = 0, GS_BAD_ID = 1, GS_BAD_ARGUMENT = 2 };

/* One part of the edge list; mirrors ctypes.Structure `_Part` in __init__.py. An edge's local
 * ids are src[e] + src_shift and dst[e] + dst_shift. */
typedef struct {
    const void *src;  /* [n] int32 or int64 per src_is64 */
    const void *dst;  /* [n] */
    const void *rel;  /* [n] or NULL */
    int64_t n;
    int64_t src_shift;
    int64_t dst_shift;
    int32_t src_is64;
    int32_t dst_is64;
    int32_t rel_is64;
} gs_part;

static inline int64_t get(const void *a, int is64, int64_t e) {
    return is64 ? ((const int64_t *)a)[e] : (int64_t)((const int32_t *)a)[e];
}

/* indptr: [num_nodes + 1]; indices, rel_out: [sum of n] (rel_out NULL without relations, and
 * then every part's rel must be NULL too). On GS_BAD_ID the outputs are unspecified. */
GS_EXPORT int gs_csc_build(const gs_part *parts, int32_t num_parts, int64_t num_nodes,
                           int64_t *indptr, int64_t *indices, int64_t *rel_out) {
    if (num_parts < 0 || num_nodes < 0 || indptr == NULL) return GS_BAD_ARGUMENT;
    memset(indptr, 0, (size_t)(num_nodes + 1) * sizeof(int64_t));
    int64_t total = 0;
    for (int32_t k = 0; k < num_parts; k++) {
        const gs_part *p = &parts[k];
        if (p->n < 0 || ((p->rel != NULL) != (rel_out != NULL))) return GS_BAD_ARGUMENT;
        for (int64_t e = 0; e < p->n; e++) {
            int64_t s = get(p->src, p->src_is64, e) + p->src_shift;
            int64_t d = get(p->dst, p->dst_is64, e) + p->dst_shift;
            /* unsigned compare: negative ids wrap to huge values and fail too */
            if ((uint64_t)s >= (uint64_t)num_nodes || (uint64_t)d >= (uint64_t)num_nodes) return GS_BAD_ID;
            indptr[d + 1]++;
        }
        total += p->n;
    }
    if (total > 0 && indices == NULL) return GS_BAD_ARGUMENT;
    /* indptr[v] becomes v's start: the exclusive prefix sum of the counts held at v + 1. */
    for (int64_t v = 0; v < num_nodes; v++) indptr[v + 1] += indptr[v];
    /* Pass 2 uses indptr[v] as v's cursor; it ends at v's stop, which is v + 1's start. */
    for (int32_t k = 0; k < num_parts; k++) {
        const gs_part *p = &parts[k];
        const int64_t ss = p->src_shift, ds = p->dst_shift;
        if (!p->src_is64 && !p->dst_is64 && rel_out == NULL) {
            /* the common case (int32 store ids, no relations) without per-edge branches */
            const int32_t *src = (const int32_t *)p->src, *dst = (const int32_t *)p->dst;
            for (int64_t e = 0; e < p->n; e++) indices[indptr[dst[e] + ds]++] = src[e] + ss;
            continue;
        }
        for (int64_t e = 0; e < p->n; e++) {
            int64_t pos = indptr[get(p->dst, p->dst_is64, e) + ds]++;
            indices[pos] = get(p->src, p->src_is64, e) + ss;
            if (rel_out != NULL) rel_out[pos] = get(p->rel, p->rel_is64, e);
        }
    }
    /* Every cursor now holds its node's stop: move them up one place, and node 0 starts at 0. */
    if (num_nodes > 0) memmove(indptr + 1, indptr, (size_t)num_nodes * sizeof(int64_t));
    indptr[0] = 0;
    return GS_OK;
}

GS_EXPORT int32_t gs_csc_abi_version(void) { return 1; }
