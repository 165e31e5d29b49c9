/* malloc/free by size and by step event, for one process or every rank of a launch (issue 41).

   Build and run (benchmarks/malloc_trace.py does both):

       cc -O2 -shared -fPIC -o /tmp/malloc_trace.so benchmarks/malloc_trace.c -ldl
       LD_PRELOAD=/tmp/malloc_trace.so MALLOC_TRACE_OUT=/tmp/trace python benchmarks/llama_script.py ...

   Every malloc, calloc, realloc, memalign, posix_memalign, aligned_alloc and free of the process goes through
   here (glibc's own, found with dlsym(RTLD_NEXT)); a table of the live blocks (mmapped beside the heap, so the
   heap it measures keeps its layout) gives each block its size and the event it was born in. The program marks
   events by calling malloc_trace_mark(label) (ctypes: ctypes.CDLL(None).malloc_trace_mark); each mark appends one
   JSON line to MALLOC_TRACE_OUT.rank<N> (PADDLE_TRAINER_ID) or .pid<pid>: what was allocated and
   freed since the last mark by size class (powers
   of two), the blocks born in the event that are still alive (the ones that outlive their step), the blocks
   allocated by threads other than the main one, the peak of live bytes and of the main heap's top (brk) within
   the event, and glibc's mallinfo2 at the mark.
*/
#define _GNU_SOURCE
#include <dlfcn.h>
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define BUCKETS 48
#define TABLE_BITS 23 /* 8M slots, 16 bytes each, mmapped and touched only where used */
#define TABLE_SIZE (1UL << TABLE_BITS)

typedef struct {
    uintptr_t ptr;
    uint64_t size_epoch; /* size in the low 40 bits, the epoch it was born in above */
} slot_t;

static void *(*real_malloc)(size_t);
static void (*real_free)(void *);
static void *(*real_calloc)(size_t, size_t);
static void *(*real_realloc)(void *, size_t);
static void *(*real_memalign)(size_t, size_t);
static int (*real_posix_memalign)(void **, size_t, size_t);
static void *(*real_aligned_alloc)(size_t, size_t);

static slot_t *table;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static __thread int inside;
static char bootstrap[1 << 16];
static size_t bootstrap_used;
static int ready;

static uint64_t epoch;
static uint64_t allocs[BUCKETS], frees[BUCKETS], alloc_bytes[BUCKETS], free_bytes[BUCKETS];
static uint64_t other_thread_allocs[BUCKETS], other_thread_bytes[BUCKETS];
static int64_t live_bytes, peak_live_bytes;
static uintptr_t brk_start, brk_peak;
static uint64_t lost; /* blocks the table had no room for */

static int bucket_of(size_t n) { return n ? (int)(64 - __builtin_clzll((unsigned long long)n)) : 0; }

static size_t slot_of(uintptr_t p) { return (size_t)((p >> 4) * 0x9E3779B97F4A7C15ULL >> (64 - TABLE_BITS)); }

static void init(void) {
    if (ready) return;
    inside++;
    real_malloc = dlsym(RTLD_NEXT, "malloc");
    real_free = dlsym(RTLD_NEXT, "free");
    real_calloc = dlsym(RTLD_NEXT, "calloc");
    real_realloc = dlsym(RTLD_NEXT, "realloc");
    real_memalign = dlsym(RTLD_NEXT, "memalign");
    real_posix_memalign = dlsym(RTLD_NEXT, "posix_memalign");
    real_aligned_alloc = dlsym(RTLD_NEXT, "aligned_alloc");
    table = mmap(NULL, TABLE_SIZE * sizeof(slot_t), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
    brk_start = brk_peak = (uintptr_t)sbrk(0);
    ready = 1;
    inside--;
}

static void record_alloc(void *p, size_t n) {
    if (!p || !table || table == MAP_FAILED) return;
    int b = bucket_of(n);
    int main_thread = syscall(SYS_gettid) == getpid();
    pthread_mutex_lock(&lock);
    size_t i = slot_of((uintptr_t)p), tries = 0;
    while (table[i].ptr && table[i].ptr != (uintptr_t)p && tries++ < TABLE_SIZE) i = (i + 1) & (TABLE_SIZE - 1);
    if (tries >= TABLE_SIZE) {
        lost++;
    } else {
        table[i].ptr = (uintptr_t)p;
        table[i].size_epoch = ((uint64_t)n & ((1ULL << 40) - 1)) | (epoch << 40);
    }
    allocs[b]++;
    alloc_bytes[b] += n;
    if (!main_thread) {
        other_thread_allocs[b]++;
        other_thread_bytes[b] += n;
    }
    live_bytes += (int64_t)n;
    if (live_bytes > peak_live_bytes) peak_live_bytes = live_bytes;
    uintptr_t top = (uintptr_t)sbrk(0);
    if (top > brk_peak) brk_peak = top;
    pthread_mutex_unlock(&lock);
}

static void record_free(void *p) {
    if (!p || !table || table == MAP_FAILED) return;
    pthread_mutex_lock(&lock);
    size_t i = slot_of((uintptr_t)p), tries = 0;
    while (table[i].ptr && table[i].ptr != (uintptr_t)p && tries++ < TABLE_SIZE) i = (i + 1) & (TABLE_SIZE - 1);
    if (table[i].ptr == (uintptr_t)p) {
        size_t n = table[i].size_epoch & ((1ULL << 40) - 1);
        int b = bucket_of(n);
        frees[b]++;
        free_bytes[b] += n;
        live_bytes -= (int64_t)n;
        /* backward-shift deletion keeps every probe chain unbroken */
        size_t j = i;
        for (;;) {
            table[i].ptr = 0;
            for (;;) {
                j = (j + 1) & (TABLE_SIZE - 1);
                if (!table[j].ptr) goto done;
                size_t home = slot_of(table[j].ptr);
                if (i <= j ? (home <= i || home > j) : (home <= i && home > j)) break;
            }
            table[i] = table[j];
            i = j;
        }
    }
done:
    pthread_mutex_unlock(&lock);
}

void *malloc(size_t n) {
    if (!ready) init();
    if (inside || !real_malloc) return real_malloc ? real_malloc(n) : NULL;
    inside++;
    void *p = real_malloc(n);
    record_alloc(p, n);
    inside--;
    return p;
}

void *calloc(size_t k, size_t n) {
    if (!real_calloc) { /* dlsym's own calloc, before glibc's is known */
        size_t want = (k * n + 15) & ~(size_t)15;
        if (bootstrap_used + want > sizeof(bootstrap)) return NULL;
        void *p = bootstrap + bootstrap_used;
        bootstrap_used += want;
        return p;
    }
    if (inside) return real_calloc(k, n);
    inside++;
    void *p = real_calloc(k, n);
    record_alloc(p, k * n);
    inside--;
    return p;
}

static int from_bootstrap(void *p) { return (char *)p >= bootstrap && (char *)p < bootstrap + sizeof(bootstrap); }

void free(void *p) {
    if (!p || from_bootstrap(p)) return;
    if (!ready) init();
    if (!inside) {
        inside++;
        record_free(p);
        inside--;
    }
    real_free(p);
}

void *realloc(void *p, size_t n) {
    if (!ready) init();
    if (from_bootstrap(p)) {
        void *q = malloc(n);
        if (q) memcpy(q, p, n);
        return q;
    }
    if (inside) return real_realloc(p, n);
    inside++;
    if (p) record_free(p);
    void *q = real_realloc(p, n);
    record_alloc(q, n);
    inside--;
    return q;
}

/* an aligned allocation through glibc's ``real`` (memalign, aligned_alloc), counted */
static void *aligned(void *(*real)(size_t, size_t), size_t a, size_t n) {
    if (inside) return real(a, n);
    inside++;
    void *p = real(a, n);
    record_alloc(p, n);
    inside--;
    return p;
}

void *memalign(size_t a, size_t n) {
    if (!ready) init();
    return aligned(real_memalign, a, n);
}

int posix_memalign(void **out, size_t a, size_t n) {
    if (!ready) init();
    if (inside) return real_posix_memalign(out, a, n);
    inside++;
    int rc = real_posix_memalign(out, a, n);
    if (rc == 0) record_alloc(*out, n);
    inside--;
    return rc;
}

void *aligned_alloc(size_t a, size_t n) {
    if (!ready) init();
    return aligned(real_aligned_alloc, a, n);
}

static void write_array(FILE *f, const char *name, const uint64_t *v) {
    fprintf(f, ",\"%s\":[", name);
    for (int b = 0; b < BUCKETS; b++) fprintf(f, "%s%llu", b ? "," : "", (unsigned long long)v[b]);
    fputc(']', f);
}

/* One JSON line for the event that ends here; the next event begins. */
void malloc_trace_mark(const char *label) {
    if (!ready) init();
    inside++;
    pthread_mutex_lock(&lock);
    uint64_t born_alive[BUCKETS] = {0}, born_alive_bytes[BUCKETS] = {0}, alive[BUCKETS] = {0};
    for (size_t i = 0; i < TABLE_SIZE; i++) {
        if (!table[i].ptr) continue;
        size_t n = table[i].size_epoch & ((1ULL << 40) - 1);
        int b = bucket_of(n);
        alive[b]++;
        if (table[i].size_epoch >> 40 == epoch) {
            born_alive[b]++;
            born_alive_bytes[b] += n;
        }
    }
    struct mallinfo2 m = mallinfo2();
    const char *dir = getenv("MALLOC_TRACE_OUT");
    char path[4096];
    const char *rank = getenv("PADDLE_TRAINER_ID"); /* a rank of paddle.distributed.launch */
    if (rank)
        snprintf(path, sizeof(path), "%s.rank%s", dir ? dir : "/tmp/malloc_trace", rank);
    else
        snprintf(path, sizeof(path), "%s.pid%d", dir ? dir : "/tmp/malloc_trace", getpid());
    FILE *f = fopen(path, "a");
    if (f) {
        fprintf(f, "{\"event\":\"%s\",\"epoch\":%llu,\"live_bytes\":%lld,\"peak_live_bytes\":%lld,"
                   "\"brk_bytes\":%llu,\"peak_brk_bytes\":%llu,\"lost\":%llu,"
                   "\"arena\":%zu,\"free_bytes\":%zu,\"free_chunks\":%zu,\"mmapped_bytes\":%zu,\"mmapped_chunks\":%zu",
                label, (unsigned long long)epoch, (long long)live_bytes, (long long)peak_live_bytes,
                (unsigned long long)((uintptr_t)sbrk(0) - brk_start), (unsigned long long)(brk_peak - brk_start),
                (unsigned long long)lost, m.arena, m.fordblks, m.ordblks, m.hblkhd, m.hblks);
        write_array(f, "allocs", allocs);
        write_array(f, "alloc_bytes", alloc_bytes);
        write_array(f, "freed", frees);
        write_array(f, "freed_bytes", free_bytes);
        write_array(f, "born_alive", born_alive);
        write_array(f, "born_alive_bytes", born_alive_bytes);
        write_array(f, "alive", alive);
        write_array(f, "other_thread_allocs", other_thread_allocs);
        write_array(f, "other_thread_bytes", other_thread_bytes);
        fputs("}\n", f);
        fclose(f);
    }
    memset(allocs, 0, sizeof(allocs));
    memset(frees, 0, sizeof(frees));
    memset(alloc_bytes, 0, sizeof(alloc_bytes));
    memset(free_bytes, 0, sizeof(free_bytes));
    memset(other_thread_allocs, 0, sizeof(other_thread_allocs));
    memset(other_thread_bytes, 0, sizeof(other_thread_bytes));
    peak_live_bytes = live_bytes;
    brk_peak = (uintptr_t)sbrk(0);
    epoch++;
    pthread_mutex_unlock(&lock);
    inside--;
}
