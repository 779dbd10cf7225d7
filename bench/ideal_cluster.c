/* The least a replicated write can cost on this machine: three "bookies" and a client in C that
 * do nothing but what every add needs (the client sends each entry to two of three bookies on
 * an open-loop schedule; a bookie reads what arrived, appends it to its file, fdatasyncs it and
 * acknowledges every entry; the client takes an add as done at its second acknowledgement).
 * No protocol, no checksum, no index, no event loop library, no interpreter: whatever latency
 * and CPU this costs, the bookies' and client's own code cannot have been the cause.
 *
 * Given a CPU cost per entry (CPU_US above 0), each process also spends at least that much CPU
 * time per entry it handles (a busy loop on its own CPU clock after each batch, so that the time
 * it is preempted does not count): the ideal structure with a real cluster's CPU per entry,
 * which says how much of that cluster's latency its CPU alone explains.
 *
 *   ideal_cluster bookie FILE RING_BYTES ENTRY_SIZE CPU_US LOG_BYTES
 *       listens on a free port of 127.0.0.1 for one client and prints "ready PORT"; appends to
 *       FILE (written over RING_BYTES once at the start, then overwritten in a ring, as a journal
 *       over space already written); prints "cpu SECONDS logged BYTES stored BYTES" when the client
 *       is gone (the bytes written to its entry log, and of the entries it stored). With CPU_US
 *       above 0 it spends that much per entry it stores before writing them, and a thread of its
 *       own syncs and acknowledges what was written meanwhile (as a bookie's journal does), so
 *       that the CPU of the entries that arrive overlaps the sync under way. With LOG_BYTES
 *       above 0 it also keeps every entry it stores (a write cache) and a thread of its own
 *       writes them a second time, to FILE.log, as any BookKeeper bookie writes its entry logs:
 *       a megabyte at a time with O_DIRECT, each synced, steadily as they come (the least such
 *       writes can disturb the journal: no index, no bursts), over LOG_BYTES written once at
 *       the start and then overwritten in a ring. Should the writes fall a write cache behind,
 *       the bookie waits for them before it stores more (as a full write cache holds adds).
 *   ideal_cluster client RATE IN_FLIGHT SECONDS WARMUP ENTRY_SIZE TICK_US CPU_US PORT0 PORT1 PORT2
 *       with RATE above 0, adds fall due every 1/RATE s for WARMUP + SECONDS and at least
 *       every TICK_US those due are sent, as bench writes --rate sends them (the latency
 *       counts from the due time); with RATE 0, IN_FLIGHT adds are kept outstanding (the
 *       latency counts from the send). Entry i goes to bookies i mod 3 and i + 1 mod 3. Prints
 *       one line: adds measured (those due or sent after the warm-up), adds sent, p50_ms,
 *       p99_ms, max_ms, and the client's CPU seconds over the whole run. CPU_US per add is
 *       spent half as the add is sent, half as its acknowledgements are taken.
 *
 * Built and run by bench/ideal_cluster.py. Linux only. */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>
#include <arpa/inet.h>

#define BOOKIES 3
#define QUORUM 2
#define ID_BYTES 8

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static double cpu_seconds(void) {
    struct rusage r;
    getrusage(RUSAGE_SELF, &r);
    return r.ru_utime.tv_sec + r.ru_utime.tv_usec / 1e6 + r.ru_stime.tv_sec + r.ru_stime.tv_usec / 1e6;
}

/* Spends CPU until this process has used ``target`` seconds of it (a busy loop on its own CPU
 * clock: preempted, it spends nothing meanwhile). */
static void spend_until(double target) {
    while (cpu_seconds() < target) {
    }
}

static void die(const char *what) {
    fprintf(stderr, "ideal_cluster: %s: %s\n", what, strerror(errno));
    exit(1);
}

static void write_all(int fd, const char *data, size_t size) {
    while (size > 0) {
        ssize_t n = write(fd, data, size);
        if (n < 0) {
            if (errno == EINTR) continue;
            die("write");
        }
        data += n;
        size -= (size_t)n;
    }
}

/* The syncing thread of a bookie that spends CPU per entry: each round syncs the file and
 * acknowledges every entry written before it began. */
struct syncer {
    pthread_mutex_t lock;
    pthread_cond_t more;
    int file, client, closing;
    char *pending; /* ids of entries written and not yet synced */
    size_t pending_size, pending_capacity;
};

static void *sync_rounds(void *argument) {
    struct syncer *s = argument;
    char *acks = NULL;
    size_t capacity = 0;
    for (;;) {
        pthread_mutex_lock(&s->lock);
        while (s->pending_size == 0 && !s->closing) pthread_cond_wait(&s->more, &s->lock);
        if (s->pending_size == 0) {
            pthread_mutex_unlock(&s->lock);
            break;
        }
        char *taken = s->pending; /* the buffers swap: the writer fills the other meanwhile */
        size_t size = s->pending_size, taken_capacity = s->pending_capacity;
        s->pending = acks;
        s->pending_capacity = capacity;
        s->pending_size = 0;
        pthread_mutex_unlock(&s->lock);
        if (fdatasync(s->file) < 0) die("fdatasync");
        write_all(s->client, taken, size);
        acks = taken;
        capacity = taken_capacity;
    }
    free(acks);
    return NULL;
}

/* A bookie's second write of every entry it stores (LOG_BYTES above 0): the entries are kept in
 * a ring (the write cache) and a thread of its own writes each LOG_CHUNK of them to the entry log
 * with O_DIRECT and syncs it (flushEntrylogBytes), steadily as they come. */
#define LOG_CHUNK (1L << 20)
#define CACHE_BYTES (64L << 20) /* a multiple of LOG_CHUNK */

struct entry_log {
    pthread_mutex_t lock;
    pthread_cond_t more, room;
    int file, closing;
    char *cache;          /* CACHE_BYTES, page-aligned: entry bytes at (count mod CACHE_BYTES) */
    long cached, logged;  /* bytes ever kept in the cache, and ever written to the entry log */
    long size, position;  /* the entry log's bytes (a ring), and where the next chunk goes */
};

static void *log_rounds(void *argument) {
    struct entry_log *l = argument;
    for (;;) {
        pthread_mutex_lock(&l->lock);
        while (l->cached - l->logged < LOG_CHUNK && !l->closing)
            pthread_cond_wait(&l->more, &l->lock);
        long from = l->logged % CACHE_BYTES, ready = l->cached - l->logged;
        pthread_mutex_unlock(&l->lock);
        if (ready < LOG_CHUNK) break; /* closing: the last partial chunk is not written */
        if (pwrite(l->file, l->cache + from, LOG_CHUNK, l->position) != LOG_CHUNK)
            die("pwrite (entry log)");
        if (fdatasync(l->file) < 0) die("fdatasync (entry log)");
        l->position = (l->position + LOG_CHUNK) % l->size;
        pthread_mutex_lock(&l->lock);
        l->logged += LOG_CHUNK;
        pthread_cond_signal(&l->room);
        pthread_mutex_unlock(&l->lock);
    }
    return NULL;
}

/* Keeps ``size`` bytes of entries in the cache for the entry-log thread, a chunk at most at a
 * time, each once there is room for it. */
static void cache_entries(struct entry_log *l, const char *data, long size) {
    while (size > 0) {
        long piece = size < LOG_CHUNK ? size : LOG_CHUNK;
        pthread_mutex_lock(&l->lock);
        while (l->cached + piece - l->logged > CACHE_BYTES) pthread_cond_wait(&l->room, &l->lock);
        long at = l->cached % CACHE_BYTES;
        pthread_mutex_unlock(&l->lock);
        long first = piece < CACHE_BYTES - at ? piece : CACHE_BYTES - at;
        memcpy(l->cache + at, data, (size_t)first);
        memcpy(l->cache, data + first, (size_t)(piece - first));
        pthread_mutex_lock(&l->lock);
        l->cached += piece;
        if (l->cached - l->logged >= LOG_CHUNK) pthread_cond_signal(&l->more);
        pthread_mutex_unlock(&l->lock);
        data += piece;
        size -= piece;
    }
}

/* Writes ``file`` over ``size`` bytes (a multiple of LOG_CHUNK) of ``zeros`` (LOG_CHUNK of them,
 * aligned for O_DIRECT) and syncs it: the file's later writes land on written space, as a
 * recycled journal's do. */
static void write_over(int file, long size, const char *zeros) {
    for (long at = 0; at < size; at += LOG_CHUNK)
        if (pwrite(file, zeros, LOG_CHUNK, at) != LOG_CHUNK) die("pwrite");
    if (fdatasync(file) < 0) die("fdatasync");
}

/* The entry log's file, written over ``size`` bytes once, opened for O_DIRECT writes (through
 * the page cache where the file system refuses them, as a bookie's entry logger does). */
static int open_entry_log(const char *path, long size, const char *zeros) {
    int file = open(path, O_CREAT | O_WRONLY | O_TRUNC | O_DIRECT, 0644);
    if (file < 0 && errno == EINVAL) file = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0644);
    if (file < 0) die("open (entry log)");
    write_over(file, size, zeros);
    return file;
}

/* Tells a bookie's thread that waits on ``more`` under ``lock`` to finish, and waits for it. */
static void stop(pthread_mutex_t *lock, pthread_cond_t *more, int *closing, pthread_t thread) {
    pthread_mutex_lock(lock);
    *closing = 1;
    pthread_cond_signal(more);
    pthread_mutex_unlock(lock);
    pthread_join(thread, NULL);
}

static int bookie(const char *path, long ring, int entry_size, double cpu_us, long log_bytes) {
    int file = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0644);
    if (file < 0) die("open");
    char *zeros = calloc(1, LOG_CHUNK);
    if (zeros == NULL) die("calloc");
    write_over(file, (ring + LOG_CHUNK - 1) / LOG_CHUNK * LOG_CHUNK, zeros);
    free(zeros);
    posix_fadvise(file, 0, 0, POSIX_FADV_DONTNEED);
    struct entry_log log = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
                            PTHREAD_COND_INITIALIZER, -1, 0, NULL, 0, 0, 0, 0};
    pthread_t log_thread;
    if (log_bytes > 0) {
        log.size = (log_bytes + LOG_CHUNK - 1) / LOG_CHUNK * LOG_CHUNK;
        int failed = posix_memalign((void **)&log.cache, 4096, CACHE_BYTES);
        if (failed) {
            errno = failed;
            die("posix_memalign");
        }
        memset(log.cache, 0, CACHE_BYTES);
        char log_path[4096];
        snprintf(log_path, sizeof log_path, "%s.log", path);
        log.file = open_entry_log(log_path, log.size, log.cache);
        if (pthread_create(&log_thread, NULL, log_rounds, &log) != 0) die("pthread_create");
    }
    int server = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(server, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in address = {.sin_family = AF_INET, .sin_port = 0};
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(server, (struct sockaddr *)&address, sizeof address) < 0) die("bind");
    if (listen(server, 1) < 0) die("listen");
    socklen_t length = sizeof address;
    if (getsockname(server, (struct sockaddr *)&address, &length) < 0) die("getsockname");
    printf("ready %d\n", ntohs(address.sin_port));
    fflush(stdout);
    int client = accept(server, NULL, NULL);
    if (client < 0) die("accept");
    setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    size_t capacity = 64 << 20, have = 0;
    char *buffer = malloc(capacity);
    char *acks = malloc(capacity / entry_size * ID_BYTES + ID_BYTES);
    long position = 0, stored = 0;
    double cpu_start = cpu_seconds();
    struct syncer syncer = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, file, client, 0,
                            NULL, 0, 0};
    pthread_t sync_thread;
    if (cpu_us > 0 && pthread_create(&sync_thread, NULL, sync_rounds, &syncer) != 0)
        die("pthread_create");
    for (;;) {
        ssize_t n = read(client, buffer + have, capacity - have);
        if (n == 0) break;
        if (n < 0) {
            if (errno == EINTR) continue;
            die("read");
        }
        have += (size_t)n;
        size_t whole = have / entry_size;
        if (whole == 0) continue;
        size_t bytes = whole * entry_size;
        stored += (long)whole;
        if (cpu_us > 0) spend_until(cpu_start + stored * cpu_us / 1e6);
        if (position + (long)bytes > ring) position = 0;
        for (size_t done = 0; done < bytes;) {
            ssize_t w = pwrite(file, buffer + done, bytes - done, position + done);
            if (w < 0) die("pwrite");
            done += (size_t)w;
        }
        position += (long)bytes;
        if (log_bytes > 0) cache_entries(&log, buffer, (long)bytes);
        if (cpu_us > 0) {
            pthread_mutex_lock(&syncer.lock);
            size_t need = syncer.pending_size + whole * ID_BYTES;
            if (need > syncer.pending_capacity) {
                syncer.pending_capacity = need * 2;
                syncer.pending = realloc(syncer.pending, syncer.pending_capacity);
                if (syncer.pending == NULL) die("realloc");
            }
            for (size_t i = 0; i < whole; i++)
                memcpy(syncer.pending + syncer.pending_size + i * ID_BYTES,
                       buffer + i * entry_size, ID_BYTES);
            syncer.pending_size = need;
            pthread_cond_signal(&syncer.more);
            pthread_mutex_unlock(&syncer.lock);
        } else {
            if (fdatasync(file) < 0) die("fdatasync");
            for (size_t i = 0; i < whole; i++)
                memcpy(acks + i * ID_BYTES, buffer + i * entry_size, ID_BYTES);
            write_all(client, acks, whole * ID_BYTES);
        }
        memmove(buffer, buffer + bytes, have - bytes);
        have -= bytes;
    }
    if (cpu_us > 0) stop(&syncer.lock, &syncer.more, &syncer.closing, sync_thread);
    if (log_bytes > 0) stop(&log.lock, &log.more, &log.closing, log_thread);
    printf("cpu %.3f logged %ld stored %ld\n", cpu_seconds(), log.logged, stored * entry_size);
    return 0;
}

static int compare(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int client(double rate, long in_flight, double seconds, double warmup, int entry_size,
                  long tick_us, double cpu_us, int ports[BOOKIES]) {
    /* Open loop (rate > 0): entry i falls due at start + i / rate, and its latency counts from
     * then. Closed loop (rate 0): in_flight adds are kept outstanding, each timed from its send. */
    int closed = rate <= 0;
    long total = closed ? (long)((warmup + seconds) * 200000) : (long)(rate * (warmup + seconds));
    int sockets[BOOKIES];
    int one = 1;
    for (int b = 0; b < BOOKIES; b++) {
        sockets[b] = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in address = {.sin_family = AF_INET, .sin_port = htons(ports[b])};
        address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (connect(sockets[b], (struct sockaddr *)&address, sizeof address) < 0) die("connect");
        setsockopt(sockets[b], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    unsigned char *copies = calloc(total, 1);
    double *sent_at = malloc(sizeof(double) * total); /* due (open loop) or sent (closed) */
    double *latency = malloc(sizeof(double) * total);
    char *out[BOOKIES];
    size_t out_size[BOOKIES];
    long batch_limit = closed ? in_flight : (long)(rate * 0.5) + 16; /* half a second's sends */
    size_t out_capacity = (size_t)batch_limit * entry_size;
    for (int b = 0; b < BOOKIES; b++) out[b] = calloc(1, out_capacity);
    static char in[BOOKIES][ID_BYTES * 4096];
    size_t in_have[BOOKIES] = {0};
    double cpu_start = cpu_seconds();
    double start = now() + 0.05;
    double measure_from = start + warmup, end = start + warmup + seconds;
    long issued = 0, done = 0, measured = 0;
    while (done < issued || (issued < total && (closed ? now() < end : 1))) {
        double t = now();
        long due;
        if (closed)
            due = t < end ? done + in_flight : issued;
        else
            due = (long)((t - start) * rate) + 1;
        if (due > total) due = total;
        if (due - issued > batch_limit) due = issued + batch_limit;
        if (due > issued) {
            for (int b = 0; b < BOOKIES; b++) out_size[b] = 0;
            for (long i = issued; i < due; i++) {
                sent_at[i] = closed ? t : start + i / rate;
                for (int c = 0; c < QUORUM; c++) {
                    int b = (int)((i + c) % BOOKIES);
                    memcpy(out[b] + out_size[b], &i, ID_BYTES);
                    out_size[b] += entry_size;
                }
            }
            if (cpu_us > 0) spend_until(cpu_start + (due + done) * cpu_us / 2e6);
            for (int b = 0; b < BOOKIES; b++)
                if (out_size[b]) write_all(sockets[b], out[b], out_size[b]);
            issued = due;
        }
        /* Wait for answers: closed loop, until one arrives; open loop, until the next add is
         * due, at least one tick (what fell due meanwhile goes out together). */
        double wait;
        if (closed) {
            wait = 1.0;
        } else {
            double next = issued < total ? start + issued / rate : t + 1.0;
            wait = next - now();
            if (wait < tick_us / 1e6) wait = tick_us / 1e6;
        }
        double until = now() + wait;
        struct pollfd polls[BOOKIES];
        for (int b = 0; b < BOOKIES; b++) polls[b] = (struct pollfd){.fd = sockets[b], .events = POLLIN};
        long done_before = done;
        while (closed ? done < issued : done < total) {
            double left = until - now();
            if (left <= 0) break;
            struct timespec timeout = {(time_t)left, (long)((left - (time_t)left) * 1e9)};
            int ready = ppoll(polls, BOOKIES, &timeout, NULL);
            if (ready < 0 && errno != EINTR) die("ppoll");
            double at = now();
            for (int b = 0; b < BOOKIES && ready > 0; b++) {
                if (!(polls[b].revents & POLLIN)) continue;
                ssize_t n = read(sockets[b], in[b] + in_have[b], sizeof in[b] - in_have[b]);
                if (n <= 0) die("read from a bookie");
                in_have[b] += (size_t)n;
                size_t whole = in_have[b] / ID_BYTES;
                for (size_t k = 0; k < whole; k++) {
                    long id;
                    memcpy(&id, in[b] + k * ID_BYTES, ID_BYTES);
                    if (++copies[id] == QUORUM) {
                        done++;
                        if (sent_at[id] >= measure_from) latency[measured++] = at - sent_at[id];
                    }
                }
                memmove(in[b], in[b] + whole * ID_BYTES, in_have[b] - whole * ID_BYTES);
                in_have[b] -= whole * ID_BYTES;
            }
            if (cpu_us > 0 && ready > 0) spend_until(cpu_start + (issued + done) * cpu_us / 2e6);
            if (closed && done > done_before) break; /* the next adds go out at once */
        }
        if (!closed && issued >= total && done >= total) break;
    }
    double cpu = cpu_seconds() - cpu_start;
    if (measured == 0) {
        fprintf(stderr, "ideal_cluster: no add measured (too short a run)\n");
        return 1;
    }
    qsort(latency, measured, sizeof(double), compare);
    printf("%ld %ld %.3f %.3f %.3f %.3f\n", measured, issued, latency[measured / 2] * 1e3,
           latency[(long)(measured * 0.99)] * 1e3, latency[measured - 1] * 1e3, cpu);
    for (int b = 0; b < BOOKIES; b++) close(sockets[b]);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 7 && strcmp(argv[1], "bookie") == 0 && atoi(argv[4]) >= ID_BYTES &&
        atof(argv[5]) >= 0 && atol(argv[6]) >= 0)
        return bookie(argv[2], atol(argv[3]), atoi(argv[4]), atof(argv[5]), atol(argv[6]));
    if (argc == 9 + BOOKIES && strcmp(argv[1], "client") == 0 && atoi(argv[6]) >= ID_BYTES &&
        (atof(argv[2]) > 0 || atol(argv[3]) > 0) && atof(argv[8]) >= 0) {
        int ports[BOOKIES];
        for (int b = 0; b < BOOKIES; b++) ports[b] = atoi(argv[9 + b]);
        return client(atof(argv[2]), atol(argv[3]), atof(argv[4]), atof(argv[5]), atoi(argv[6]),
                      atol(argv[7]), atof(argv[8]), ports);
    }
    fprintf(stderr,
            "usage: ideal_cluster bookie FILE RING_BYTES ENTRY_SIZE CPU_US LOG_BYTES\n"
            "       ideal_cluster client RATE IN_FLIGHT SECONDS WARMUP ENTRY_SIZE TICK_US CPU_US "
            "PORT0 PORT1 PORT2\n"
            "(an entry holds at least %d bytes; RATE 0 keeps IN_FLIGHT adds outstanding)\n",
            ID_BYTES);
    return 2;
}
