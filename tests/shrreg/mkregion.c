/*
 * mkregion: writes and drives HAMi-core shared-region files ("cudevshr.cache") for tests.
 *
 * It carries its OWN struct definitions for every layout variant documented in
 * Project-HAMi/HAMi-core src/multiprocess/multiprocess_memory_limit.h (and its history) (v0b, v1.1, v1.1-transient, v1.2), checked by static
 * asserts against the documented sizes and offsets, and uses real glibc process-shared
 * semaphores (sem_init(pshared=1)), so the Python reader is tested against bytes produced the
 * way the C library produces them, not against bytes the Python side wrote itself.
 *
 * Usage (LAYOUT is one of v0b v1.1 v1.1-transient v1.2):
 *   mkregion create  PATH LAYOUT NDEV LIMIT_MIB SM_LIMIT  create + initialise like try_create_shrreg
 *   mkregion slot    PATH LAYOUT PID HOSTPID STATUS BYTES_DEV0 [BYTES_DEV1 ...]
 *                                          append a process slot under the semaphore
 *   mkregion halfslot PATH LAYOUT PID      fill procs[proc_num] without proc_num++ (crash mid-add)
 *   mkregion oddseq  PATH LAYOUT INDEX     leave slot INDEX's seqlock odd (writer died mid-update)
 *   mkregion lock    PATH LAYOUT OWNER     take the semaphore, store owner_pid=OWNER, exit holding it
 *   mkregion live    PATH LAYOUT SECONDS [hold|noslot]
 *                                          attach, register own slot (not with noslot), optionally hold
 *                                          the lock, sleep
 *   mkregion writer  PATH LAYOUT ITERATIONS [LINGER_SECONDS]
 *                                          attach, register own slot, then ITERATIONS times: lock,
 *                                          find own slot by pid, used[0] += 1, unlock; then linger
 *   mkregion semval  PATH LAYOUT           print "sem=<value> postinit=<value|none> owner=<pid> proc_num=<n>"
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <semaphore.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAGIC 19920718
#define NDEVMAX 16
#define NPROC 1024

/* ---------------- v0b (HAMi v2.4.0, HAMi-core 7a9c88b) ---------------- */
typedef struct { uint64_t context_size, module_size, data_size, offset, total; } v0_mem_t;
typedef struct { uint64_t dec_util, enc_util, sm_util; } v0_util_t;
typedef struct {
    int32_t pid, hostpid;
    v0_mem_t used[NDEVMAX];
    uint64_t monitorused[NDEVMAX];
    v0_util_t device_util[NDEVMAX];
    int32_t status;
} v0_slot_t;
typedef struct {
    int32_t initialized_flag, sm_init_flag;
    size_t owner_pid;
    sem_t sem;
    uint64_t device_num;
    char uuids[NDEVMAX][96];
    uint64_t limit[NDEVMAX], sm_limit[NDEVMAX];
    v0_slot_t procs[NPROC];
    int32_t proc_num, utilization_switch, recent_kernel, priority;
} v0_region_t;
_Static_assert(sizeof(v0_slot_t) == 1168, "v0b slot");
_Static_assert(offsetof(v0_slot_t, status) == 1160, "v0b status");
_Static_assert(offsetof(v0_region_t, procs) == 1848, "v0b procs");
_Static_assert(offsetof(v0_region_t, proc_num) == 1197880, "v0b proc_num");
_Static_assert(sizeof(v0_region_t) == 1197896, "v0b size");

/* ---------------- v1.x common pieces ---------------- */
typedef struct { uint64_t context_size, module_size, data_size, offset, total, unused[3]; } v1_mem_t;
typedef struct { uint64_t dec_util, enc_util, sm_util, unused[3]; } v1_util_t;

/* v1.1 (HAMi v2.4.1 .. v2.8.0): slot tail is unused[3], region tail unused[4] */
typedef struct {
    int32_t pid, hostpid;
    v1_mem_t used[NDEVMAX];
    uint64_t monitorused[NDEVMAX];
    v1_util_t device_util[NDEVMAX];
    int32_t status;
    uint64_t unused[3];
} v11_slot_t;
typedef struct {
    int32_t initialized_flag;
    uint32_t major_version, minor_version;
    int32_t sm_init_flag;
    size_t owner_pid;
    sem_t sem;
    uint64_t device_num;
    char uuids[NDEVMAX][96];
    uint64_t limit[NDEVMAX], sm_limit[NDEVMAX];
    v11_slot_t procs[NPROC];
    int32_t proc_num, utilization_switch, recent_kernel, priority;
    uint64_t last_kernel_time;
    uint64_t unused[4];
} v11_region_t;
_Static_assert(sizeof(v11_slot_t) == 1960, "v1.1 slot");
_Static_assert(offsetof(v11_slot_t, status) == 1928, "v1.1 status");
_Static_assert(offsetof(v11_region_t, procs) == 1856, "v1.1 procs");
_Static_assert(offsetof(v11_region_t, proc_num) == 2008896, "v1.1 proc_num");
_Static_assert(sizeof(v11_region_t) == 2008952, "v1.1 size");

/* v1.1-transient (HAMi v2.8.1): seqlock at slot+8, sem_postinit at +56 */
typedef struct {
    int32_t pid, hostpid;
    uint64_t seqlock;
    v1_mem_t used[NDEVMAX];
    uint64_t monitorused[NDEVMAX];
    v1_util_t device_util[NDEVMAX];
    int32_t status;
    uint64_t unused[2];
} v1t_slot_t;
typedef struct {
    int32_t initialized_flag;
    uint32_t major_version, minor_version;
    int32_t sm_init_flag;
    size_t owner_pid;
    sem_t sem;
    sem_t sem_postinit;
    uint64_t device_num;
    char uuids[NDEVMAX][96];
    uint64_t limit[NDEVMAX], sm_limit[NDEVMAX];
    v1t_slot_t procs[NPROC];
    int32_t proc_num, utilization_switch, recent_kernel, priority;
    uint64_t last_kernel_time;
    uint64_t unused[4];
} v1t_region_t;
_Static_assert(sizeof(v1t_slot_t) == 1960, "transient slot");
_Static_assert(offsetof(v1t_slot_t, status) == 1936, "transient status");
_Static_assert(offsetof(v1t_region_t, device_num) == 88, "transient device_num");
_Static_assert(offsetof(v1t_region_t, procs) == 1888, "transient procs");
_Static_assert(offsetof(v1t_region_t, proc_num) == 2008928, "transient proc_num");
_Static_assert(sizeof(v1t_region_t) == 2008984, "transient size");

/* v1.2 (HAMi v2.8.2+ / HEAD): seqlock in the old unused[0], sem_postinit in the old unused[4] */
typedef struct {
    int32_t pid, hostpid;
    v1_mem_t used[NDEVMAX];
    uint64_t monitorused[NDEVMAX];
    v1_util_t device_util[NDEVMAX];
    int32_t status;
    uint64_t seqlock;
    uint64_t unused[2];
} v12_slot_t;
typedef struct {
    int32_t initialized_flag;
    uint32_t major_version, minor_version;
    int32_t sm_init_flag;
    size_t owner_pid;
    sem_t sem;
    uint64_t device_num;
    char uuids[NDEVMAX][96];
    uint64_t limit[NDEVMAX], sm_limit[NDEVMAX];
    v12_slot_t procs[NPROC];
    int32_t proc_num, utilization_switch, recent_kernel, priority;
    uint64_t last_kernel_time;
    sem_t sem_postinit;
} v12_region_t;
_Static_assert(sizeof(v12_slot_t) == 1960, "v1.2 slot");
_Static_assert(offsetof(v12_slot_t, seqlock) == 1936, "v1.2 seqlock");
_Static_assert(offsetof(v12_region_t, sem_postinit) == 2008920, "v1.2 sem_postinit");
_Static_assert(sizeof(v12_region_t) == 2008952, "v1.2 size");

/* A layout-independent view: pointers into the mapping plus slot field offsets. */
typedef struct {
    const char *name;
    size_t size;
    int major, minor; /* 0/0: no version fields */
    char *base;
    int32_t *initialized_flag, *sm_init_flag, *proc_num, *utilization_switch, *recent_kernel, *priority;
    uint32_t *major_version, *minor_version;
    size_t *owner_pid;
    sem_t *sem, *sem_postinit;
    uint64_t *device_num, *limit, *sm_limit, *last_kernel_time;
    char (*uuids)[96];
    char *procs;
    size_t slot_size, s_pid, s_hostpid, s_used, s_used_stride, s_monitorused, s_util, s_util_stride,
        s_status, s_seqlock; /* s_seqlock == 0: none */
    int init_postinit;   /* library initialises sem_postinit */
} view_t;

#define VIEW_COMMON(R, S, v, b)                                                         \
    do {                                                                                \
        R *r_ = (R *)(b);                                                               \
        (v)->size = sizeof(R);                                                          \
        (v)->base = (b);                                                                \
        (v)->initialized_flag = &r_->initialized_flag;                                  \
        (v)->sm_init_flag = &r_->sm_init_flag;                                          \
        (v)->owner_pid = &r_->owner_pid;                                                \
        (v)->sem = &r_->sem;                                                            \
        (v)->device_num = &r_->device_num;                                              \
        (v)->uuids = r_->uuids;                                                         \
        (v)->limit = r_->limit;                                                         \
        (v)->sm_limit = r_->sm_limit;                                                   \
        (v)->procs = (char *)r_->procs;                                                 \
        (v)->proc_num = &r_->proc_num;                                                  \
        (v)->utilization_switch = &r_->utilization_switch;                              \
        (v)->recent_kernel = &r_->recent_kernel;                                        \
        (v)->priority = &r_->priority;                                                  \
        (v)->slot_size = sizeof(S);                                                     \
        (v)->s_pid = offsetof(S, pid);                                                  \
        (v)->s_hostpid = offsetof(S, hostpid);                                          \
        (v)->s_used = offsetof(S, used);                                                \
        (v)->s_used_stride = sizeof(((S *)0)->used[0]);                                 \
        (v)->s_monitorused = offsetof(S, monitorused);                                  \
        (v)->s_util = offsetof(S, device_util);                                         \
        (v)->s_util_stride = sizeof(((S *)0)->device_util[0]);                          \
        (v)->s_status = offsetof(S, status);                                            \
    } while (0)

static size_t layout_size(const char *name) {
    if (!strcmp(name, "v0b")) return sizeof(v0_region_t);
    if (!strcmp(name, "v1.1")) return sizeof(v11_region_t);
    if (!strcmp(name, "v1.1-transient")) return sizeof(v1t_region_t);
    if (!strcmp(name, "v1.2")) return sizeof(v12_region_t);
    fprintf(stderr, "unknown layout %s\n", name);
    exit(2);
}

static void make_view(view_t *v, const char *name, char *b) {
    memset(v, 0, sizeof(*v));
    v->name = name;
    if (!strcmp(name, "v0b")) {
        VIEW_COMMON(v0_region_t, v0_slot_t, v, b);
    } else if (!strcmp(name, "v1.1")) {
        v11_region_t *r = (v11_region_t *)b;
        VIEW_COMMON(v11_region_t, v11_slot_t, v, b);
        v->major_version = &r->major_version; v->minor_version = &r->minor_version;
        v->last_kernel_time = &r->last_kernel_time;
        v->major = 1; v->minor = 1;
        /* v1.1 has no sem_postinit: its trailer is unused[4], left zero */
    } else if (!strcmp(name, "v1.1-transient")) {
        v1t_region_t *r = (v1t_region_t *)b;
        VIEW_COMMON(v1t_region_t, v1t_slot_t, v, b);
        v->major_version = &r->major_version; v->minor_version = &r->minor_version;
        v->last_kernel_time = &r->last_kernel_time;
        v->sem_postinit = &r->sem_postinit; v->init_postinit = 1;
        v->s_seqlock = offsetof(v1t_slot_t, seqlock);
        v->major = 1; v->minor = 1;
    } else if (!strcmp(name, "v1.2")) {
        v12_region_t *r = (v12_region_t *)b;
        VIEW_COMMON(v12_region_t, v12_slot_t, v, b);
        v->major_version = &r->major_version; v->minor_version = &r->minor_version;
        v->last_kernel_time = &r->last_kernel_time;
        v->sem_postinit = &r->sem_postinit; v->init_postinit = 1;
        v->s_seqlock = offsetof(v12_slot_t, seqlock);
        v->major = 1; v->minor = 2;
    } else {
        fprintf(stderr, "unknown layout %s\n", name);
        exit(2);
    }
}

static char *slot_at(view_t *v, int i) { return v->procs + (size_t)i * v->slot_size; }
#define FIELD(T, p, off) (*(T *)((p) + (off)))

static int g_fd = -1;

static char *map_file(const char *path, const char *layout, int create) {
    size_t size = layout_size(layout);
    int fd = open(path, O_RDWR | (create ? O_CREAT : 0), 0666);
    if (fd < 0) { perror("open"); exit(1); }
    if (create) {
        /* same as try_create_shrreg: seek to SIZE, write one NUL -> file is SIZE+1 bytes */
        if (lseek(fd, (off_t)size, SEEK_SET) < 0 || write(fd, "", 1) != 1) { perror("extend"); exit(1); }
    }
    char *b = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (b == MAP_FAILED) { perror("mmap"); exit(1); }
    g_fd = fd;
    return b;
}

static void lock_sem(view_t *v) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 10;
    while (sem_timedwait(v->sem, &ts) != 0) {
        if (errno == EINTR) continue;
        fprintf(stderr, "mkregion: lock timeout (errno=%d)\n", errno);
        exit(3);
    }
    *v->owner_pid = (size_t)getpid();
    __sync_synchronize();
}

static void unlock_sem(view_t *v) {
    __sync_synchronize();
    *v->owner_pid = 0;
    sem_post(v->sem);
}

static int add_slot(view_t *v, int pid, int hostpid, int status, int ndev, char **bytes) {
    int i = *v->proc_num;
    char *s = slot_at(v, i);
    memset(s, 0, v->slot_size);
    if (v->s_seqlock) FIELD(uint64_t, s, v->s_seqlock) = 0;
    FIELD(int32_t, s, v->s_pid) = pid;
    FIELD(int32_t, s, v->s_hostpid) = hostpid;
    for (int d = 0; d < ndev && d < NDEVMAX; d++) {
        uint64_t n = strtoull(bytes[d], NULL, 0);
        char *m = s + v->s_used + (size_t)d * v->s_used_stride;
        /* context_size, module_size, data_size, offset, total */
        uint64_t ctx = n >= (1u << 20) ? (1u << 20) : 0;
        FIELD(uint64_t, m, 0) = ctx;
        FIELD(uint64_t, m, 16) = n - ctx;
        FIELD(uint64_t, m, 32) = n;
        FIELD(uint64_t, s, v->s_monitorused + 8 * (size_t)d) = n;
        FIELD(uint64_t, s, v->s_util + (size_t)d * v->s_util_stride + 16) = (uint64_t)(10 * (d + 1));
    }
    FIELD(int32_t, s, v->s_status) = status;
    __sync_synchronize();
    __sync_fetch_and_add(v->proc_num, 1);
    return i;
}

static int find_slot(view_t *v, int pid) {
    for (int i = 0; i < *v->proc_num && i < NPROC; i++)
        if (FIELD(int32_t, slot_at(v, i), v->s_pid) == pid) return i;
    return -1;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: mkregion CMD PATH LAYOUT ...\n");
        return 2;
    }
    const char *cmd = argv[1], *path = argv[2], *layout = argv[3];
    view_t v;

    if (!strcmp(cmd, "create")) {
        if (argc < 7) { fprintf(stderr, "create PATH LAYOUT NDEV LIMIT_MIB SM_LIMIT\n"); return 2; }
        umask(0);
        char *b = map_file(path, layout, 1);
        make_view(&v, layout, b);
        int ndev = atoi(argv[4]);
        uint64_t limit = strtoull(argv[5], NULL, 0) << 20;
        uint64_t sm = strtoull(argv[6], NULL, 0);
        if (lockf(g_fd, F_LOCK, (off_t)v.size) != 0) { perror("lockf"); return 1; }
        if (*v.initialized_flag != MAGIC) {
            if (v.major_version) { *v.major_version = v.major; *v.minor_version = v.minor; }
            for (int d = 0; d < NDEVMAX; d++) { v.limit[d] = limit; v.sm_limit[d] = sm ? sm : 100; }
            sem_init(v.sem, 1, 1);
            if (v.init_postinit) sem_init(v.sem_postinit, 1, 1);
            *v.sm_init_flag = 0;
            *v.utilization_switch = 1;
            *v.recent_kernel = 2;
            *v.proc_num = 0;
            *v.priority = 1;
            *v.device_num = (uint64_t)ndev;
            for (int d = 0; d < ndev && d < NDEVMAX; d++)
                snprintf(v.uuids[d], 96, "GPU-%08x-0000-4000-8000-%012x", 0xabc00000u + (unsigned)d,
                         (unsigned)d);
            __sync_synchronize();
            *v.initialized_flag = MAGIC;
        }
        if (v.last_kernel_time) *v.last_kernel_time = (uint64_t)time(NULL);
        lockf(g_fd, F_ULOCK, (off_t)v.size);
        return 0;
    }

    char *b = map_file(path, layout, 0);
    make_view(&v, layout, b);

    if (!strcmp(cmd, "slot")) {
        if (argc < 8) { fprintf(stderr, "slot PATH LAYOUT PID HOSTPID STATUS BYTES...\n"); return 2; }
        lock_sem(&v);
        int i = add_slot(&v, atoi(argv[4]), atoi(argv[5]), atoi(argv[6]), argc - 7, argv + 7);
        unlock_sem(&v);
        printf("%d\n", i);
        return 0;
    }
    if (!strcmp(cmd, "halfslot")) {
        lock_sem(&v);
        char *s = slot_at(&v, *v.proc_num);
        memset(s, 0, v.slot_size);
        FIELD(int32_t, s, v.s_pid) = atoi(argv[4]);
        FIELD(int32_t, s, v.s_status) = 1;
        /* no proc_num++: the writer "died" between filling and publishing the slot */
        unlock_sem(&v);
        return 0;
    }
    if (!strcmp(cmd, "oddseq")) {
        if (!v.s_seqlock) { fprintf(stderr, "layout %s has no seqlock\n", layout); return 2; }
        char *s = slot_at(&v, atoi(argv[4]));
        FIELD(uint64_t, s, v.s_seqlock) |= 1;
        return 0;
    }
    if (!strcmp(cmd, "lock")) {
        if (sem_trywait(v.sem) != 0) { perror("sem_trywait"); return 1; }
        *v.owner_pid = (size_t)strtoull(argv[4], NULL, 0);
        return 0; /* exit while holding: the semaphore stays at 0 */
    }
    if (!strcmp(cmd, "live")) {
        int secs = atoi(argv[4]);
        int hold = argc > 5 && !strcmp(argv[5], "hold");
        int noslot = argc > 5 && !strcmp(argv[5], "noslot");
        char *env_bytes = getenv("MKREGION_BYTES"); /* tracked bytes on device 0 for the live slot */
        char *used[] = {env_bytes ? env_bytes : "0"};
        if (!noslot) {
            lock_sem(&v);
            add_slot(&v, getpid(), 0, 1, 1, used);
            if (!hold) unlock_sem(&v);
        }
        printf("READY %d\n", getpid());
        fflush(stdout);
        sleep((unsigned)secs);
        return 0; /* like SIGKILL: no exit handler cleanup */
    }
    if (!strcmp(cmd, "writer")) {
        long iters = atol(argv[4]);
        char *zero[] = {"0"};
        lock_sem(&v);
        add_slot(&v, getpid(), getpid(), 1, 1, zero);
        unlock_sem(&v);
        printf("READY %d\n", getpid());
        fflush(stdout);
        long done = 0;
        for (long k = 0; k < iters; k++) {
            lock_sem(&v);
            int i = find_slot(&v, getpid());
            if (i < 0) { fprintf(stderr, "writer: own slot lost\n"); unlock_sem(&v); return 4; }
            char *m = slot_at(&v, i) + v.s_used;
            uint64_t t = FIELD(uint64_t, m, 32);
            usleep(20); /* widen the window in which an unlocked writer would lose updates */
            FIELD(uint64_t, m, 32) = t + 1;
            FIELD(uint64_t, m, 16) += 1;
            unlock_sem(&v);
            done++;
            if ((k & 7) == 0) usleep(100);
        }
        printf("DONE %ld\n", done);
        fflush(stdout);
        if (argc > 5) sleep((unsigned)atoi(argv[5])); /* linger: stay alive and attached */
        return 0;
    }
    if (!strcmp(cmd, "semval")) {
        int a = -1, p = -1;
        sem_getvalue(v.sem, &a);
        if (v.sem_postinit) sem_getvalue(v.sem_postinit, &p);
        if (v.sem_postinit)
            printf("sem=%d postinit=%d owner=%zu proc_num=%d\n", a, p, *v.owner_pid, *v.proc_num);
        else
            printf("sem=%d postinit=none owner=%zu proc_num=%d\n", a, *v.owner_pid, *v.proc_num);
        return 0;
    }
    fprintf(stderr, "unknown command %s\n", cmd);
    return 2;
}
