/* Reading runs of feature blocks and checking each block's crc32c, without the GIL.
 *
 * Plain C99 with no Python headers, loaded with ctypes by graphstore/layout/_native/__init__.py,
 * whose caller, graphstore/layout/_rowsets.py, states the contract. A scattered row set is
 * read as runs of ~4 KiB blocks; in Python every run cost a pread call plus a checksum call
 * per block under the GIL, which held four reader threads to about one request in flight
 * (~30k requests/s on the development machine's SSD). Here a worker thread hands one group
 * of runs to gs_read_runs, which releases nothing and needs nothing from Python: it reads
 * each run into its place in the scratch buffer (pread until complete), then checks every
 * block of the group against its stored crc32c.
 *
 * crc32c (Castagnoli, reflected, init and final xor 0xffffffff: what the `crc32c` Python
 * package and zarr's crc32c codec compute): SSE4.2's crc32 instruction where the CPU has it
 * (checked once at run time: the build has no -march), else slicing-by-8 tables.
 */

#define _XOPEN_SOURCE 700 /* pread */
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#if defined(_WIN32)
#define GS_EXPORT __declspec(dllexport)
#else
#define GS_EXPORT __attribute__((visibility("default")))
#endif

enum { GS_OK = 0, GS_SHORT = 1, GS_IO_ERROR = 2, GS_BAD_CRC = 3 };

GS_EXPORT int32_t gs_rowsets_abi_version(void) { return 1; }

/* ------------------------------------------------------------------ crc32c */

static uint32_t table[8][256];
static int table_ready = 0;

static void make_table(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
        table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++) table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xff];
    table_ready = 1;
}

static uint32_t crc_soft(uint32_t crc, const unsigned char *p, size_t n) {
    while (n && ((uintptr_t)p & 7)) { crc = (crc >> 8) ^ table[0][(crc ^ *p++) & 0xff]; n--; }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= crc;
        crc = table[7][w & 0xff] ^ table[6][(w >> 8) & 0xff] ^ table[5][(w >> 16) & 0xff] ^
              table[4][(w >> 24) & 0xff] ^ table[3][(w >> 32) & 0xff] ^ table[2][(w >> 40) & 0xff] ^
              table[1][(w >> 48) & 0xff] ^ table[0][w >> 56];
        p += 8;
        n -= 8;
    }
    while (n--) crc = (crc >> 8) ^ table[0][(crc ^ *p++) & 0xff];
    return crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define GS_HAVE_SSE42 1
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t crc, const unsigned char *p, size_t n) {
    uint64_t c = crc;
    while (n && ((uintptr_t)p & 7)) { c = __builtin_ia32_crc32qi((uint32_t)c, *p++); n--; }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = __builtin_ia32_crc32di(c, w);
        p += 8;
        n -= 8;
    }
    while (n--) c = __builtin_ia32_crc32qi((uint32_t)c, *p++);
    return (uint32_t)c;
}
#endif

static int use_hw = -1;

static uint32_t crc32c(const unsigned char *p, size_t n) {
    if (use_hw < 0) {
#ifdef GS_HAVE_SSE42
        __builtin_cpu_init();
        use_hw = __builtin_cpu_supports("sse4.2") ? 1 : 0;
#else
        use_hw = 0;
#endif
    }
#ifdef GS_HAVE_SSE42
    if (use_hw) return crc_hw(0xffffffffu, p, n) ^ 0xffffffffu;
#endif
    if (!table_ready) make_table();
    return crc_soft(0xffffffffu, p, n) ^ 0xffffffffu;
}

/* Exposed for the tests: the same checksum the `crc32c` package computes. */
GS_EXPORT uint32_t gs_crc32c(const unsigned char *p, int64_t n) { return crc32c(p, (size_t)n); }

/* ------------------------------------------------------------------ runs */

/* Read run r (r < num_runs): len[r] bytes of file fds[r] at file_off[r] into
 * scratch + dest_off[r]. Then check block b (b < num_blocks): bytes
 * [block_off[b], block_off[b] + block_len[b]) of scratch against crcs[b].
 * Returns GS_OK; or GS_SHORT / GS_IO_ERROR with *bad = the run (and *err = errno);
 * or GS_BAD_CRC with *bad = the block and *got = the computed crc. */
GS_EXPORT int gs_read_runs(const int32_t *fds, const int64_t *file_off, const int64_t *len, const int64_t *dest_off,
                           int64_t num_runs, unsigned char *scratch, const int64_t *block_off,
                           const int64_t *block_len, const uint32_t *crcs, int64_t num_blocks, int64_t *bad,
                           uint32_t *got, int32_t *err) {
    if (use_hw < 0 || (!use_hw && !table_ready)) (void)crc32c(scratch, 0);  /* choose once */
    for (int64_t r = 0; r < num_runs; r++) {
        int64_t done = 0;
        while (done < len[r]) {
            ssize_t k = pread(fds[r], scratch + dest_off[r] + done, (size_t)(len[r] - done), file_off[r] + done);
            if (k < 0) {
                if (errno == EINTR) continue;
                *bad = r;
                *err = errno;
                return GS_IO_ERROR;
            }
            if (k == 0) {
                *bad = r;
                *err = 0;
                return GS_SHORT;
            }
            done += k;
        }
    }
    for (int64_t b = 0; b < num_blocks; b++) {
        uint32_t c = crc32c(scratch + block_off[b], (size_t)block_len[b]);
        if (c != crcs[b]) {
            *bad = b;
            *got = c;
            return GS_BAD_CRC;
        }
    }
    return GS_OK;
}
