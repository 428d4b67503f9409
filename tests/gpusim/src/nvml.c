/*
 * gpusim libnvidia-ml.so.1: a SIMULATED NVML. No GPU, no driver: every answer comes from the state
 * file ($GPUSIM_STATE, default /etc/gpusim/state.json; schema in tests/gpusim/README.md).
 *
 * Behaves like the real library where our agent depends on it: same symbols (the versioned names
 * pynvml resolves), same struct layouts and return codes, reference-counted init, handles that stay
 * valid across calls, NOT_SUPPORTED / GPU_IS_LOST per device, XID events through event sets, and
 * hangs that block inside the call forever, as the real driver does in the seed-003 incident.
 *
 * Thread safety: one mutex guards the state; a hanging call releases it before blocking, so other
 * threads behave like they would against a driver stuck on one ioctl (they may hang too if faulted).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "json.h"
#include "nvml_sim.h"
#include "state.h"

#define DEFAULT_STATE_PATH "/etc/gpusim/state.json"
#define MIB (1024ULL * 1024ULL)

/* NVIDIA's list for the NVML init hang on nodes mixing MIG slices and full GPUs. */
static const char *const known_bad_drivers[] = {"570.124.06", "570.133.20", "570.148.08", "570.158.01"};

struct gs_handle {
    int gpu;
    int mig; /* -1: the full GPU */
};

struct gs_event_set {
    unsigned magic;
    unsigned long long mask[GS_MAX_GPUS];
};
#define EVENT_SET_MAGIC 0x65767473u

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static gs_state *cur;          /* last good state; NULL until one loaded */
static struct stat cur_stat;   /* identity of the file cur was read from */
static char last_error[512];   /* last load error reported on stderr (reported once per change) */
static int init_refcount;
static unsigned long long call_count;
static unsigned long long delivered_seq[GS_MAX_GPUS]; /* XID events are delivered once per process */

static struct gs_handle gpu_handles[GS_MAX_GPUS];
static struct gs_handle mig_handles[GS_MAX_GPUS][GS_MAX_MIG];
static pthread_once_t handles_once = PTHREAD_ONCE_INIT;

static void init_handles(void)
{
    for (int i = 0; i < GS_MAX_GPUS; i++) {
        gpu_handles[i].gpu = i;
        gpu_handles[i].mig = -1;
        for (int j = 0; j < GS_MAX_MIG; j++) {
            mig_handles[i][j].gpu = i;
            mig_handles[i][j].mig = j;
        }
    }
}

static const char *state_path(void)
{
    const char *p = getenv("GPUSIM_STATE");
    return (p && *p) ? p : DEFAULT_STATE_PATH;
}

static void report_error(const char *msg)
{
    if (strcmp(msg, last_error)) {
        snprintf(last_error, sizeof(last_error), "%s", msg);
        fprintf(stderr, "gpusim: %s\n", msg);
        fflush(stderr);
    }
}

static void free_state(gs_state *st)
{
    if (st) {
        js_free(st->tree);
        free(st);
    }
}

/* Re-read the state file if it changed. Caller holds the lock. Returns 0 when a state is usable. */
static int refresh_state(void)
{
    const char *path = state_path();
    struct stat sb;
    char msg[480];
    if (stat(path, &sb)) {
        snprintf(msg, sizeof(msg), "cannot read state file %s: %s (set GPUSIM_STATE or run `gpusim init`)",
                 path, strerror(errno));
        report_error(msg);
        return cur ? 0 : -1;
    }
    if (cur && sb.st_ino == cur_stat.st_ino && sb.st_dev == cur_stat.st_dev && sb.st_size == cur_stat.st_size &&
        sb.st_mtim.tv_sec == cur_stat.st_mtim.tv_sec && sb.st_mtim.tv_nsec == cur_stat.st_mtim.tv_nsec)
        return 0;

    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(msg, sizeof(msg), "cannot read state file %s: %s", path, strerror(errno));
        report_error(msg);
        return cur ? 0 : -1;
    }
    size_t cap = (size_t)sb.st_size + 1, len = 0;
    char *text = malloc(cap + 1);
    if (!text) {
        fclose(f);
        return cur ? 0 : -1;
    }
    size_t n;
    while ((n = fread(text + len, 1, cap - len, f)) > 0) {
        len += n;
        if (len == cap) {
            char *bigger = realloc(text, cap * 2 + 1);
            if (!bigger)
                break;
            text = bigger;
            cap *= 2;
        }
    }
    fclose(f);
    text[len] = '\0';

    char err[256];
    js *doc = js_parse(text, err, sizeof(err));
    free(text);
    gs_state *st = NULL;
    if (!doc) {
        snprintf(msg, sizeof(msg), "state file %s is not valid JSON (%s)", path, err);
    } else {
        st = malloc(sizeof(*st));
        if (st && gs_state_from_json(doc, st, err, sizeof(err))) {
            snprintf(msg, sizeof(msg), "state file %s is invalid: %s", path, err);
            free(st);
            st = NULL;
        }
    }
    if (!st) {
        js_free(doc);
        report_error(msg);
        return cur ? 0 : -1;
    }
    free_state(cur);
    cur = st;
    cur_stat = sb;
    last_error[0] = '\0';
    return 0;
}

/* Like a process stuck in the driver: never returns. Called with the state lock held; releases it.
 *
 * Two models (tests/gpusim/README.md, docs/gpusim.md):
 * - default: sleep in pause(). Signals with handlers wake pause() and we go back to sleep; default-action
 *   signals (SIGTERM, SIGKILL) end the process, so a SIGKILL cleans this hang up.
 * - faults.hang_file set: first read() that file. When it is a FUSE file whose server takes the read and
 *   never answers (tests/gpusim/dstate.py), the kernel keeps this thread in request_wait_answer(); after
 *   SIGKILL that wait is uninterruptible (state D, SIGKILL pending), exactly like a thread stuck in an
 *   ioctl of the real driver: the process cannot exit until the read is answered. */
static void hang_unlock_forever(void)
{
    char file[sizeof(cur->hang_file)];
    snprintf(file, sizeof(file), "%s", cur->hang_file);
    pthread_mutex_unlock(&lock);
    if (file[0]) {
        int fd = open(file, O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            char c;
            ssize_t n = read(fd, &c, 1);
            (void)n; /* answered (the "driver" returned): still a hang, fall through to pause() */
            close(fd);
        }
    }
    for (;;)
        pause();
}

/* "nvmlDeviceGetMemoryInfo_v2" and "nvmlDeviceGetMemoryInfo" name the same call for fault matching;
 * every init variant is "nvmlInit". */
static void canonical(const char *name, char *out, size_t n)
{
    if (!strncmp(name, "nvmlInit", 8)) {
        snprintf(out, n, "nvmlInit");
        return;
    }
    snprintf(out, n, "%s", name);
    char *v = strrchr(out, '_');
    if (v && v[1] == 'v' && v[2] >= '0' && v[2] <= '9')
        *v = '\0';
}

static int listed(const char *fn, char names[][64], int n)
{
    char a[80], b[80];
    canonical(fn, a, sizeof(a));
    for (int i = 0; i < n; i++) {
        canonical(names[i], b, sizeof(b));
        if (!strcmp(a, b))
            return 1;
    }
    return 0;
}

static int hang_requested(const char *fn)
{
    if (cur->hang_after_calls >= 0 && call_count > (unsigned long long)cur->hang_after_calls)
        return 1;
    return listed(fn, cur->hangfn, cur->nhangfn);
}

/* Entry of every call: takes the lock, refreshes the state, counts the call, applies hang faults.
 * On NVML_SUCCESS the lock is held and must be released with leave(). */
static nvmlReturn_t enter(const char *fn, int need_init)
{
    pthread_once(&handles_once, init_handles);
    pthread_mutex_lock(&lock);
    if (refresh_state()) {
        pthread_mutex_unlock(&lock);
        return NVML_ERROR_UNKNOWN;
    }
    call_count++;
    if (hang_requested(fn))
        hang_unlock_forever();
    if (need_init && init_refcount == 0) {
        pthread_mutex_unlock(&lock);
        return NVML_ERROR_UNINITIALIZED;
    }
    if (need_init && listed(fn, cur->unsupported, cur->nunsupported)) {
        pthread_mutex_unlock(&lock);
        return NVML_ERROR_NOT_SUPPORTED;
    }
    return NVML_SUCCESS;
}

static nvmlReturn_t leave(nvmlReturn_t ret)
{
    pthread_mutex_unlock(&lock);
    return ret;
}

#define BEGIN(name)                                   \
    nvmlReturn_t ret__ = enter(name, 1);              \
    if (ret__ != NVML_SUCCESS)                        \
        return ret__
#define END(r) return leave(r)

/* Resolve a handle against the current state. */
static nvmlReturn_t resolve(nvmlDevice_t h, gs_gpu **g, gs_mig **m)
{
    if (!h)
        return NVML_ERROR_INVALID_ARGUMENT;
    int is_gpu = h >= &gpu_handles[0] && h < &gpu_handles[GS_MAX_GPUS];
    int is_mig = h >= &mig_handles[0][0] && h < &mig_handles[0][0] + GS_MAX_GPUS * GS_MAX_MIG;
    if (!is_gpu && !is_mig)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (h->gpu >= cur->ngpus)
        return NVML_ERROR_INVALID_ARGUMENT;
    *g = &cur->gpu[h->gpu];
    *m = NULL;
    if (h->mig >= 0) {
        gs_mig *mig = &(*g)->mig[h->mig];
        if ((*g)->mig_current != 1 || !mig->present)
            return NVML_ERROR_INVALID_ARGUMENT;
        *m = mig;
    }
    if ((*g)->lost)
        return NVML_ERROR_GPU_IS_LOST;
    return NVML_SUCCESS;
}

#define RESOLVE(h, g, m)                           \
    gs_gpu *g;                                     \
    gs_mig *m;                                     \
    {                                              \
        nvmlReturn_t r__ = resolve((h), &g, &m);   \
        if (r__ != NVML_SUCCESS)                   \
            END(r__);                              \
    }                                              \
    (void)m

static nvmlReturn_t copy_out(char *dst, unsigned len, const char *src)
{
    if (!dst)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > len)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}

static int is_mixed_mig(void)
{
    int mig = 0, full = 0;
    for (int i = 0; i < cur->ngpus; i++) {
        if (cur->gpu[i].mig_current == 1)
            mig = 1;
        else
            full = 1;
    }
    return mig && full;
}

static int known_bad_driver(void)
{
    for (size_t i = 0; i < sizeof(known_bad_drivers) / sizeof(known_bad_drivers[0]); i++)
        if (!strcmp(cur->driver_version, known_bad_drivers[i]))
            return 1;
    return 0;
}

/* ------------------------------------------------------------------ init / shutdown / errors */

NVML_EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    nvmlReturn_t r = enter("nvmlInitWithFlags", 0);
    if (r != NVML_SUCCESS)
        return r;
    if (!cur->driver_loaded)
        return leave(NVML_ERROR_DRIVER_NOT_LOADED);
    if (cur->init_hang || (cur->known_bad_driver_hang && known_bad_driver() && is_mixed_mig()))
        hang_unlock_forever();
    if (cur->module_version[0] && strcmp(cur->module_version, cur->driver_version))
        return leave(NVML_ERROR_LIB_RM_VERSION_MISMATCH);
    init_refcount++;
    return leave(NVML_SUCCESS);
}

NVML_EXPORT nvmlReturn_t nvmlInit_v2(void)
{
    return nvmlInitWithFlags(0);
}

NVML_EXPORT nvmlReturn_t nvmlInit(void)
{
    return nvmlInitWithFlags(0);
}

NVML_EXPORT nvmlReturn_t nvmlShutdown(void)
{
    BEGIN("nvmlShutdown");
    init_refcount--;
    END(NVML_SUCCESS);
}

NVML_EXPORT const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt request issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM: return "The operating system has blocked the request.";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Insufficient resources for request";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    case NVML_ERROR_DEPRECATED: return "Deprecated";
    case NVML_ERROR_NOT_READY: return "Not Ready";
    case NVML_ERROR_GPU_NOT_FOUND: return "GPU not found";
    case NVML_ERROR_INVALID_STATE: return "Invalid state";
    default: return "Unknown Error";
    }
}

/* ------------------------------------------------------------------ system */

NVML_EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    BEGIN("nvmlSystemGetDriverVersion");
    END(copy_out(version, length, cur->driver_version));
}

/* Documented without NVML_ERROR_UNINITIALIZED: usable before nvmlInit (return codes: nvml.h). */
NVML_EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    nvmlReturn_t r = enter("nvmlSystemGetNVMLVersion", 0);
    if (r != NVML_SUCCESS)
        return r;
    END(copy_out(version, length, cur->nvml_version));
}

/* Asks libcuda.so.1 itself, so it needs no nvmlInit; no CUDA driver library -> LIBRARY_NOT_FOUND. */
NVML_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v)
{
    nvmlReturn_t r = enter("nvmlSystemGetCudaDriverVersion", 0);
    if (r != NVML_SUCCESS)
        return r;
    if (!v)
        END(NVML_ERROR_INVALID_ARGUMENT);
    if (cur->cuda_driver_version <= 0)
        END(NVML_ERROR_LIBRARY_NOT_FOUND);
    *v = cur->cuda_driver_version;
    END(NVML_SUCCESS);
}

NVML_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v)
{
    return nvmlSystemGetCudaDriverVersion(v);
}

/* ------------------------------------------------------------------ device enumeration */

NVML_EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count)
{
    BEGIN("nvmlDeviceGetCount_v2");
    if (!count)
        END(NVML_ERROR_INVALID_ARGUMENT);
    *count = (unsigned)cur->ngpus;
    END(NVML_SUCCESS);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *count)
{
    return nvmlDeviceGetCount_v2(count);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    BEGIN("nvmlDeviceGetHandleByIndex_v2");
    if (!device || index >= (unsigned)cur->ngpus)
        END(NVML_ERROR_INVALID_ARGUMENT);
    if (cur->gpu[index].lost) /* documented: a GPU that fell off the bus gives no handle */
        END(NVML_ERROR_GPU_IS_LOST);
    *device = &gpu_handles[index];
    END(NVML_SUCCESS);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    BEGIN("nvmlDeviceGetHandleByUUID");
    if (!uuid || !device)
        END(NVML_ERROR_INVALID_ARGUMENT);
    for (int i = 0; i < cur->ngpus; i++) /* documented: GPU_IS_LOST "if any GPU has fallen off the bus" */
        if (cur->gpu[i].lost)
            END(NVML_ERROR_GPU_IS_LOST);
    for (int i = 0; i < cur->ngpus; i++) {
        gs_gpu *g = &cur->gpu[i];
        if (!strcmp(g->uuid, uuid)) {
            *device = &gpu_handles[i];
            END(g->lost ? NVML_ERROR_GPU_IS_LOST : NVML_SUCCESS);
        }
        if (g->mig_current != 1)
            continue;
        for (int j = 0; j < GS_MAX_MIG; j++) {
            if (g->mig[j].present && !strcmp(g->mig[j].uuid, uuid)) {
                *device = &mig_handles[i][j];
                END(g->lost ? NVML_ERROR_GPU_IS_LOST : NVML_SUCCESS);
            }
        }
    }
    END(NVML_ERROR_NOT_FOUND);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *busId, nvmlDevice_t *device)
{
    BEGIN("nvmlDeviceGetHandleByPciBusId_v2");
    unsigned d, b, dev, fn = 0;
    if (!busId || !device || sscanf(busId, "%x:%x:%x.%x", &d, &b, &dev, &fn) < 3)
        END(NVML_ERROR_INVALID_ARGUMENT);
    for (int i = 0; i < cur->ngpus; i++) {
        gs_gpu *g = &cur->gpu[i];
        if (g->domain == d && g->bus == b && g->device == dev && g->function == fn) {
            *device = &gpu_handles[i];
            END(g->lost ? NVML_ERROR_GPU_IS_LOST : NVML_SUCCESS);
        }
    }
    END(NVML_ERROR_NOT_FOUND);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *busId, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByPciBusId_v2(busId, device);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    BEGIN("nvmlDeviceGetIndex");
    RESOLVE(device, g, m);
    if (!index || m)
        END(m ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT);
    *index = (unsigned)device->gpu;
    END(NVML_SUCCESS);
}

/* ------------------------------------------------------------------ identity */

NVML_EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    BEGIN("nvmlDeviceGetName");
    RESOLVE(device, g, m);
    if (m) {
        char buf[160];
        snprintf(buf, sizeof(buf), "%s MIG %s", g->name, m->profile);
        END(copy_out(name, length, buf));
    }
    END(copy_out(name, length, g->name));
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    BEGIN("nvmlDeviceGetUUID");
    RESOLVE(device, g, m);
    END(copy_out(uuid, length, m ? m->uuid : g->uuid));
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length)
{
    BEGIN("nvmlDeviceGetSerial");
    RESOLVE(device, g, m);
    END(copy_out(serial, length, g->serial));
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minor)
{
    BEGIN("nvmlDeviceGetMinorNumber");
    RESOLVE(device, g, m);
    if (!minor)
        END(NVML_ERROR_INVALID_ARGUMENT);
    *minor = g->minor;
    END(NVML_SUCCESS);
}

static void fill_pci(const gs_gpu *g, nvmlPciInfo_t *pci)
{
    memset(pci, 0, sizeof(*pci));
    snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "%04X:%02X:%02X.%X", g->domain & 0xFFFF, g->bus,
             g->device, g->function);
    snprintf(pci->busId, sizeof(pci->busId), "%08X:%02X:%02X.%X", g->domain, g->bus, g->device, g->function);
    pci->domain = g->domain;
    pci->bus = g->bus;
    pci->device = g->device;
    pci->pciDeviceId = g->pci_device_id;
    pci->pciSubSystemId = g->pci_subsystem_id;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    BEGIN("nvmlDeviceGetPciInfo_v3");
    RESOLVE(device, g, m);
    if (!pci)
        END(NVML_ERROR_INVALID_ARGUMENT);
    fill_pci(g, pci);
    END(NVML_SUCCESS);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    return nvmlDeviceGetPciInfo_v3(device, pci);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    return nvmlDeviceGetPciInfo_v3(device, pci);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t device, int *node)
{
    BEGIN("nvmlDeviceGetNumaNodeId");
    RESOLVE(device, g, m);
    if (!node)
        END(NVML_ERROR_INVALID_ARGUMENT);
    if (g->numa_node < 0)
        END(NVML_ERROR_NOT_SUPPORTED);
    *node = g->numa_node;
    END(NVML_SUCCESS);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor)
{
    BEGIN("nvmlDeviceGetCudaComputeCapability");
    RESOLVE(device, g, m);
    if (!major || !minor)
        END(NVML_ERROR_INVALID_ARGUMENT);
    *major = g->cc_major;
    *minor = g->cc_minor;
    END(NVML_SUCCESS);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t device, nvmlDeviceArchitecture_t *arch)
{
    BEGIN("nvmlDeviceGetArchitecture");
    RESOLVE(device, g, m);
    if (!arch)
        END(NVML_ERROR_INVALID_ARGUMENT);
    *arch = g->architecture;
    END(NVML_SUCCESS);
}

static unsigned cores_per_sm(const gs_gpu *g)
{
    return g->architecture == 7 ? 64 : 128; /* GA100 has 64 FP32 cores per SM; Hopper/Ada 128 */
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetNumGpuCores(nvmlDevice_t device, unsigned int *n)
{
    BEGIN("nvmlDeviceGetNumGpuCores");
    RESOLVE(device, g, m);
    if (!n)
        END(NVML_ERROR_INVALID_ARGUMENT);
    *n = (m ? m->sm_count : g->cores) * cores_per_sm(g);
    END(NVML_SUCCESS);
}

/* ------------------------------------------------------------------ memory */

static unsigned long long mig_used_mib(const gs_gpu *g, const gs_mig *m)
{
    unsigned long long used = 0;
    for (int i = 0; i < g->nproc; i++)
        if (g->proc[i].gi_id == m->gi_id)
            used += g->proc[i].used_mib;
    return used;
}

static nvmlReturn_t memory_of(gs_gpu *g, gs_mig *m, unsigned long long *total, unsigned long long *used)
{
    if (m) {
        *total = m->memory_mib * MIB;
        *used = mig_used_mib(g, m) * MIB;
        return NVML_SUCCESS;
    }
    if (!g->memory_info_supported)
        return NVML_ERROR_NOT_SUPPORTED;
    *total = g->memory_total_mib * MIB;
    *used = g->memory_used_mib * MIB;
    if (*used > *total)
        *used = *total;
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    BEGIN("nvmlDeviceGetMemoryInfo");
    RESOLVE(device, g, m);
    if (!memory)
        END(NVML_ERROR_INVALID_ARGUMENT);
    unsigned long long total, used;
    nvmlReturn_t r = memory_of(g, m, &total, &used);
    if (r != NVML_SUCCESS)
        END(r);
    memory->total = total;
    memory->used = used;
    memory->free = total - used;
    END(NVML_SUCCESS);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    BEGIN("nvmlDeviceGetMemoryInfo_v2");
    RESOLVE(device, g, m);
    if (!memory)
        END(NVML_ERROR_INVALID_ARGUMENT);
    if (memory->version != nvmlMemory_v2)
        END(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    unsigned long long total, used;
    nvmlReturn_t r = memory_of(g, m, &total, &used);
    if (r != NVML_SUCCESS)
        END(r);
    memory->total = total;
    memory->reserved = 0;
    memory->used = used;
    memory->free = total - used;
    END(NVML_SUCCESS);
}

/* ------------------------------------------------------------------ modes and telemetry */

NVML_EXPORT nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t device, nvmlComputeMode_t *mode)
{
    BEGIN("nvmlDeviceGetComputeMode");
    RESOLVE(device, g, m);
    if (!mode)
        END(NVML_ERROR_INVALID_ARGUMENT);
    *mode = (nvmlComputeMode_t)g->compute_mode;
    END(NVML_SUCCESS);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, nvmlEnableState_t *mode)
{
    BEGIN("nvmlDeviceGetPersistenceMode");
    RESOLVE(device, g, m);
    if (!mode)
        END(NVML_ERROR_INVALID_ARGUMENT);
    *mode = g->persistence_mode ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    END(NVML_SUCCESS);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *util)
{
    BEGIN("nvmlDeviceGetUtilizationRates");
    RESOLVE(device, g, m);
    if (!util)
        END(NVML_ERROR_INVALID_ARGUMENT);
    if (m || g->mig_current == 1) /* nvidia-smi shows N/A for MIG-enabled GPUs */
        END(NVML_ERROR_NOT_SUPPORTED);
    util->gpu = g->util_gpu;
    util->memory = g->util_mem;
    END(NVML_SUCCESS);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensor,
                                                  unsigned int *temp)
{
    BEGIN("nvmlDeviceGetTemperature");
    RESOLVE(device, g, m);
    if (!temp || sensor != NVML_TEMPERATURE_GPU)
        END(NVML_ERROR_INVALID_ARGUMENT);
    if (m)
        END(NVML_ERROR_NOT_SUPPORTED);
    *temp = g->temperature_c;
    END(NVML_SUCCESS);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *mw)
{
    BEGIN("nvmlDeviceGetPowerUsage");
    RESOLVE(device, g, m);
    if (!mw)
        END(NVML_ERROR_INVALID_ARGUMENT);
    if (m)
        END(NVML_ERROR_NOT_SUPPORTED);
    *mw = g->power_mw;
    END(NVML_SUCCESS);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device, unsigned int *mw)
{
    BEGIN("nvmlDeviceGetPowerManagementLimit");
    RESOLVE(device, g, m);
    if (!mw)
        END(NVML_ERROR_INVALID_ARGUMENT);
    if (m)
        END(NVML_ERROR_NOT_SUPPORTED);
    *mw = g->power_limit_mw;
    END(NVML_SUCCESS);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *mw)
{
    return nvmlDeviceGetPowerManagementLimit(device, mw);
}

static nvmlReturn_t running_processes(nvmlDevice_t device, unsigned int *count, nvmlProcessInfo_t *infos,
                                      const char *fn)
{
    BEGIN(fn);
    RESOLVE(device, g, m);
    if (!count)
        END(NVML_ERROR_INVALID_ARGUMENT);
    unsigned n = 0;
    for (int i = 0; i < g->nproc; i++)
        if (!m || g->proc[i].gi_id == m->gi_id)
            n++;
    if (n == 0) {
        *count = 0;
        END(NVML_SUCCESS);
    }
    if (!infos || *count < n) {
        *count = n;
        END(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    unsigned k = 0;
    for (int i = 0; i < g->nproc; i++) {
        if (m && g->proc[i].gi_id != m->gi_id)
            continue;
        infos[k].pid = g->proc[i].pid;
        infos[k].usedGpuMemory = g->proc[i].used_mib * MIB;
        infos[k].gpuInstanceId = g->proc[i].gi_id;
        infos[k].computeInstanceId = g->proc[i].ci_id;
        k++;
    }
    *count = k;
    END(NVML_SUCCESS);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *count,
                                                                 nvmlProcessInfo_t *infos)
{
    return running_processes(device, count, infos, "nvmlDeviceGetComputeRunningProcesses_v3");
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *count,
                                                                 nvmlProcessInfo_t *infos)
{
    return running_processes(device, count, infos, "nvmlDeviceGetComputeRunningProcesses_v2");
}

/* ------------------------------------------------------------------ MIG */

NVML_EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *current, unsigned int *pending)
{
    BEGIN("nvmlDeviceGetMigMode");
    RESOLVE(device, g, m);
    if (!current || !pending)
        END(NVML_ERROR_INVALID_ARGUMENT);
    if (m || !g->mig_capable)
        END(NVML_ERROR_NOT_SUPPORTED);
    *current = (unsigned)g->mig_current;
    *pending = (unsigned)g->mig_pending;
    END(NVML_SUCCESS);
}

/* Persist a new pending MIG mode into the state file, atomically (temp + rename, under the same
 * advisory lock file the Python tools use). Caller holds the mutex. */
static nvmlReturn_t write_pending(int gpu, unsigned mode)
{
    js *mig = js_get(js_at(js_get(cur->tree, "gpus"), (size_t)gpu), "mig");
    if (!mig || js_set_int(mig, "pending", mode))
        return NVML_ERROR_UNKNOWN;
    const char *path = state_path();
    char lockpath[4200], tmp[4200];
    snprintf(lockpath, sizeof(lockpath), "%s.lock", path);
    snprintf(tmp, sizeof(tmp), "%s.gpusim-%d.tmp", path, (int)getpid());
    int lfd = open(lockpath, O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
    if (lfd >= 0)
        flock(lfd, LOCK_EX);
    nvmlReturn_t ret = NVML_SUCCESS;
    FILE *f = fopen(tmp, "w");
    if (!f || js_dump(cur->tree, f) || fclose(f) || rename(tmp, path)) {
        if (f)
            unlink(tmp);
        ret = NVML_ERROR_NO_PERMISSION;
    }
    if (lfd >= 0) {
        flock(lfd, LOCK_UN);
        close(lfd);
    }
    if (ret == NVML_SUCCESS) {
        cur->gpu[gpu].mig_pending = (int)mode;
        stat(path, &cur_stat); /* our own write: no need to re-read */
    }
    return ret;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceSetMigMode(nvmlDevice_t device, unsigned int mode,
                                              nvmlReturn_t *activationStatus)
{
    BEGIN("nvmlDeviceSetMigMode");
    RESOLVE(device, g, m);
    if (!activationStatus || mode > 1)
        END(NVML_ERROR_INVALID_ARGUMENT);
    if (m || !g->mig_capable)
        END(NVML_ERROR_NOT_SUPPORTED);
    nvmlReturn_t r = write_pending(device->gpu, mode);
    *activationStatus = r;
    END(r);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMig)
{
    BEGIN("nvmlDeviceIsMigDeviceHandle");
    RESOLVE(device, g, m);
    if (!isMig)
        END(NVML_ERROR_INVALID_ARGUMENT);
    *isMig = m ? 1 : 0;
    END(NVML_SUCCESS);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count)
{
    BEGIN("nvmlDeviceGetMaxMigDeviceCount");
    RESOLVE(device, g, m);
    if (!count)
        END(NVML_ERROR_INVALID_ARGUMENT);
    if (m || !g->mig_capable)
        END(NVML_ERROR_NOT_SUPPORTED);
    *count = g->mig_max;
    END(NVML_SUCCESS);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                             nvmlDevice_t *migDevice)
{
    BEGIN("nvmlDeviceGetMigDeviceHandleByIndex");
    RESOLVE(device, g, m);
    if (!migDevice || m)
        END(NVML_ERROR_INVALID_ARGUMENT);
    if (!g->mig_capable)
        END(NVML_ERROR_NOT_SUPPORTED);
    if (g->mig_current != 1 || index >= g->mig_max)
        END(NVML_ERROR_INVALID_ARGUMENT);
    if (!g->mig[index].present)
        END(NVML_ERROR_NOT_FOUND);
    *migDevice = &mig_handles[device->gpu][index];
    END(NVML_SUCCESS);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice,
                                                                      nvmlDevice_t *device)
{
    BEGIN("nvmlDeviceGetDeviceHandleFromMigDeviceHandle");
    RESOLVE(migDevice, g, m);
    if (!device || !m)
        END(NVML_ERROR_INVALID_ARGUMENT);
    *device = &gpu_handles[migDevice->gpu];
    END(NVML_SUCCESS);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id)
{
    BEGIN("nvmlDeviceGetGpuInstanceId");
    RESOLVE(device, g, m);
    if (!id)
        END(NVML_ERROR_INVALID_ARGUMENT);
    if (!m)
        END(NVML_ERROR_NOT_SUPPORTED);
    *id = m->gi_id;
    END(NVML_SUCCESS);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id)
{
    BEGIN("nvmlDeviceGetComputeInstanceId");
    RESOLVE(device, g, m);
    if (!id)
        END(NVML_ERROR_INVALID_ARGUMENT);
    if (!m)
        END(NVML_ERROR_NOT_SUPPORTED);
    *id = m->ci_id;
    END(NVML_SUCCESS);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device, nvmlDeviceAttributes_t *attr)
{
    BEGIN("nvmlDeviceGetAttributes_v2");
    RESOLVE(device, g, m);
    if (!attr)
        END(NVML_ERROR_INVALID_ARGUMENT);
    memset(attr, 0, sizeof(*attr));
    if (m) {
        attr->multiprocessorCount = m->sm_count;
        attr->gpuInstanceSliceCount = m->slices;
        attr->computeInstanceSliceCount = m->slices;
        attr->memorySizeMB = m->memory_mib;
        attr->sharedCopyEngineCount = m->slices;
        attr->sharedDecoderCount = m->slices;
    } else {
        attr->multiprocessorCount = g->cores;
        attr->gpuInstanceSliceCount = 7;
        attr->computeInstanceSliceCount = 7;
        attr->memorySizeMB = g->memory_total_mib;
        attr->sharedCopyEngineCount = 8;
        attr->sharedDecoderCount = 7;
    }
    END(NVML_SUCCESS);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetAttributes(nvmlDevice_t device, nvmlDeviceAttributes_t *attr)
{
    return nvmlDeviceGetAttributes_v2(device, attr);
}

/* ------------------------------------------------------------------ events */

NVML_EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
    BEGIN("nvmlEventSetCreate");
    if (!set)
        END(NVML_ERROR_INVALID_ARGUMENT);
    struct gs_event_set *s = calloc(1, sizeof(*s));
    if (!s)
        END(NVML_ERROR_MEMORY);
    s->magic = EVENT_SET_MAGIC;
    *set = s;
    END(NVML_SUCCESS);
}

NVML_EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
    BEGIN("nvmlEventSetFree");
    if (!set || set->magic != EVENT_SET_MAGIC)
        END(NVML_ERROR_INVALID_ARGUMENT);
    set->magic = 0;
    free(set);
    END(NVML_SUCCESS);
}

#define SUPPORTED_EVENTS                                                                           \
    (nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError | nvmlEventTypePState |       \
     nvmlEventTypeXidCriticalError | nvmlEventTypeClock)

NVML_EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *types)
{
    BEGIN("nvmlDeviceGetSupportedEventTypes");
    RESOLVE(device, g, m);
    if (!types)
        END(NVML_ERROR_INVALID_ARGUMENT);
    *types = SUPPORTED_EVENTS;
    END(NVML_SUCCESS);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long types,
                                                  nvmlEventSet_t set)
{
    BEGIN("nvmlDeviceRegisterEvents");
    RESOLVE(device, g, m);
    if (!set || set->magic != EVENT_SET_MAGIC || m)
        END(NVML_ERROR_INVALID_ARGUMENT);
    if (types & ~SUPPORTED_EVENTS)
        END(NVML_ERROR_NOT_SUPPORTED);
    set->mask[device->gpu] |= types;
    END(NVML_SUCCESS);
}

/* Find the lowest-seq undelivered XID event on a registered GPU. Caller holds the mutex. */
static int next_event(nvmlEventSet_t set, nvmlEventData_t *data)
{
    int best_gpu = -1;
    const gs_xid *best = NULL;
    for (int i = 0; i < cur->ngpus; i++) {
        if (!(set->mask[i] & nvmlEventTypeXidCriticalError))
            continue;
        const gs_gpu *g = &cur->gpu[i];
        for (int j = 0; j < g->nxid; j++) {
            const gs_xid *x = &g->xid[j];
            if (x->seq > delivered_seq[i] && (!best || x->seq < best->seq)) {
                best = x;
                best_gpu = i;
            }
        }
    }
    if (!best)
        return 0;
    delivered_seq[best_gpu] = best->seq;
    data->device = &gpu_handles[best_gpu];
    data->eventType = nvmlEventTypeXidCriticalError;
    data->eventData = best->xid;
    data->gpuInstanceId = best->gi_id;
    data->computeInstanceId = best->ci_id;
    return 1;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* An inotify instance watching the state file's directory (every writer replaces the file by rename), or
 * -1 when inotify cannot be had. The directory's own removal or rename is watched too, so a wait re-arms
 * on a directory replaced under it. Needs no lock. */
static int watch_state_dir(void)
{
    char dir[4200];
    snprintf(dir, sizeof(dir), "%s", state_path());
    char *slash = strrchr(dir, '/');
    if (!slash)
        snprintf(dir, sizeof(dir), ".");
    else if (slash == dir)
        dir[1] = '\0';
    else
        *slash = '\0';
    int fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    uint32_t mask = IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_MODIFY | IN_DELETE_SELF | IN_MOVE_SELF;
    if (fd >= 0 && inotify_add_watch(fd, dir, mask) < 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

/* The real driver sleeps in the kernel until it has an event; so does this wait, until the state file's
 * directory changes (an XID or a lost GPU written by the tools), instead of re-reading the file every
 * 20 ms, which cost an idle agent's NVML worker 2-3 ms of CPU a second. The watch is set up before the
 * first look, so no write between the look and the sleep is missed. Until 2026-11-29 it also re-read the
 * file every second as a safety net for a directory replaced under it; that case now wakes the wait and
 * re-arms the watch, so an idle wait does not wake at all (GPUSIM_EVENT_FALLBACK_MS > 0 brings a periodic
 * re-read back). Without inotify the wait polls every 20 ms. */
/* Sleep up to ``left`` seconds for the state file's directory to change (``wfd``), or 20 ms without a watch.
 * Returns 1 when the watched directory itself went away (the watch is dead: re-arm it). */
static int sleep_for_state_change(int wfd, double left)
{
    if (wfd < 0) {
        double step = left < 0.02 ? left : 0.02;
        struct timespec ts = {0, (long)(step * 1e9)};
        nanosleep(&ts, NULL);
        return 0;
    }
    const char *fb = getenv("GPUSIM_EVENT_FALLBACK_MS");
    double fallback = fb && atoi(fb) > 0 ? atoi(fb) / 1000.0 : left; /* unset: no periodic re-read */
    double step = fallback < left ? fallback : left;
    struct pollfd pfd = {wfd, POLLIN, 0};
    int gone = 0;
    if (poll(&pfd, 1, (int)(step * 1000.0) + 1) > 0) {
        char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
        ssize_t n;
        while ((n = read(wfd, buf, sizeof(buf))) > 0) {
            for (char *at = buf; at < buf + n;) {
                const struct inotify_event *ev = (const struct inotify_event *)at;
                gone |= (ev->mask & (IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED)) != 0;
                at += sizeof(struct inotify_event) + ev->len;
            }
        }
    }
    return gone;
}

NVML_EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
    nvmlReturn_t r = enter("nvmlEventSetWait_v2", 1);
    if (r != NVML_SUCCESS)
        return r;
    if (!set || set->magic != EVENT_SET_MAGIC || !data)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    double deadline = now_s() + timeoutms / 1000.0;
    int wfd = watch_state_dir();
    refresh_state();
    nvmlReturn_t ret = NVML_ERROR_TIMEOUT; /* returned with the lock already released */
    for (;;) {
        if (next_event(set, data)) {
            ret = leave(NVML_SUCCESS);
            break;
        }
        int lost = 0; /* documented: GPU_IS_LOST if a (registered) GPU fell off */
        for (int i = 0; i < cur->ngpus; i++)
            lost |= set->mask[i] && cur->gpu[i].lost;
        if (lost) {
            ret = leave(NVML_ERROR_GPU_IS_LOST);
            break;
        }
        pthread_mutex_unlock(&lock);
        double left = deadline - now_s();
        if (left <= 0)
            break;
        if (sleep_for_state_change(wfd, left)) { /* re-armed before the re-read: no write is missed */
            close(wfd);
            wfd = watch_state_dir();
        }
        pthread_mutex_lock(&lock);
        refresh_state();
    }
    if (wfd >= 0)
        close(wfd);
    return ret;
}

NVML_EXPORT nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
    return nvmlEventSetWait_v2(set, data, timeoutms);
}

/* ------------------------------------------------------------------ GPU / compute instances (MIG)
 *
 * Dynamic MIG as the driver does it: GPU instances (GI) at a profile's legal placements, one compute
 * instance (CI) per GI spanning the whole GI (the one HAMi's and our device plugin create), and the MIG
 * device that appears with the CI. Rules and return codes (nvml.h doc comments; NVIDIA MIG user guide):
 * - a profile is addressed by its NVML_GPU_INSTANCE_PROFILE_* index for the profile-info calls and by
 *   its profile ID (info.id) for everything else; MIG must be enabled (else NOT_SUPPORTED);
 * - a placement not among the profile's possible placements -> INVALID_ARGUMENT; one that overlaps an
 *   existing GI's memory slices, or a profile already at its maximum instance count ->
 *   INSUFFICIENT_RESOURCES;
 * - destroying a GI that still has a CI, or a GI/CI with a running process -> IN_USE;
 * - a handle of a destroyed instance -> INVALID_ARGUMENT.
 * Every change is written to the state file (under the lock file, re-read first), so nvidia-smi, other
 * processes and a restarted agent see it. Gaps: GI IDs are the lowest free ones (the driver ties them to
 * the placement), CIs smaller than their GI are not offered (NOT_SUPPORTED), MIG UUIDs are a hash of the
 * parent UUID and a creation counter. */

struct gs_gi_handle {
    int gpu;
    unsigned id;
};

struct gs_ci_handle {
    int gpu;
    unsigned gi;
    unsigned ci;
};

static struct gs_gi_handle gi_handles[GS_MAX_GPUS][GS_MAX_GI_ID];
static struct gs_ci_handle ci_handles[GS_MAX_GPUS][GS_MAX_GI_ID][GS_MAX_MIG];
static pthread_once_t instance_handles_once = PTHREAD_ONCE_INIT;

static void init_instance_handles(void)
{
    for (int g = 0; g < GS_MAX_GPUS; g++) {
        for (unsigned i = 0; i < GS_MAX_GI_ID; i++) {
            gi_handles[g][i].gpu = g;
            gi_handles[g][i].id = i;
            for (unsigned c = 0; c < GS_MAX_MIG; c++) {
                ci_handles[g][i][c].gpu = g;
                ci_handles[g][i][c].gi = i;
                ci_handles[g][i][c].ci = c;
            }
        }
    }
}

/* CI profile index whose slice count equals the GI's (NVML_COMPUTE_INSTANCE_PROFILE_*). */
static int ci_profile_for_slices(unsigned slices)
{
    switch (slices) {
    case 1: return 0;
    case 2: return 1;
    case 3: return 2;
    case 4: return 3;
    case 7: return 4;
    case 8: return 5;
    case 6: return 6;
    default: return -1;
    }
}

static const gs_profile *profile_by_index(const gs_gpu *g, unsigned index)
{
    for (int i = 0; i < g->nprofiles; i++)
        if (g->profiles[i].nvml_index == index)
            return &g->profiles[i];
    return NULL;
}

static const gs_profile *profile_by_id(const gs_gpu *g, unsigned id)
{
    for (int i = 0; i < g->nprofiles; i++)
        if (g->profiles[i].id == id)
            return &g->profiles[i];
    return NULL;
}

static gs_gi *gi_by_id(gs_gpu *g, unsigned id)
{
    for (int i = 0; i < g->ngi; i++)
        if (g->gi[i].id == id)
            return &g->gi[i];
    return NULL;
}

static gs_mig *mig_of_gi(gs_gpu *g, unsigned gi, unsigned ci)
{
    for (int j = 0; j < GS_MAX_MIG; j++)
        if (g->mig[j].present && g->mig[j].gi_id == gi && g->mig[j].ci_id == ci)
            return &g->mig[j];
    return NULL;
}

static int gi_has_process(const gs_gpu *g, unsigned gi, int ci)
{
    for (int i = 0; i < g->nproc; i++)
        if (g->proc[i].gi_id == gi && (ci < 0 || g->proc[i].ci_id == (unsigned)ci ||
                                       g->proc[i].ci_id == NVML_VALUE_NOT_AVAILABLE_UINT))
            return 1;
    return 0;
}

/* A full-GPU handle of a MIG-enabled GPU; the checks every instance call starts with. */
static nvmlReturn_t mig_gpu(nvmlDevice_t device, gs_gpu **out)
{
    gs_gpu *g;
    gs_mig *m;
    nvmlReturn_t r = resolve(device, &g, &m);
    if (r != NVML_SUCCESS)
        return r;
    if (m)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!g->mig_capable || g->mig_current != 1)
        return NVML_ERROR_NOT_SUPPORTED;
    *out = g;
    return NVML_SUCCESS;
}

static nvmlReturn_t resolve_gi(nvmlGpuInstance_t h, gs_gpu **g, gs_gi **gi)
{
    if (!h || h < &gi_handles[0][0] || h >= &gi_handles[0][0] + GS_MAX_GPUS * GS_MAX_GI_ID)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (h->gpu >= cur->ngpus)
        return NVML_ERROR_INVALID_ARGUMENT;
    *g = &cur->gpu[h->gpu];
    if ((*g)->lost)
        return NVML_ERROR_GPU_IS_LOST;
    if ((*g)->mig_current != 1 || !(*gi = gi_by_id(*g, h->id)))
        return NVML_ERROR_INVALID_ARGUMENT; /* destroyed, or MIG turned off meanwhile */
    return NVML_SUCCESS;
}

static nvmlReturn_t resolve_ci(nvmlComputeInstance_t h, gs_gpu **g, gs_gi **gi, gs_mig **m)
{
    if (!h || h < &ci_handles[0][0][0] || h >= &ci_handles[0][0][0] + GS_MAX_GPUS * GS_MAX_GI_ID * GS_MAX_MIG)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = resolve_gi(&gi_handles[h->gpu][h->gi], g, gi);
    if (r != NVML_SUCCESS)
        return r;
    if (!(*m = mig_of_gi(*g, h->gi, h->ci)))
        return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

/* --- state file edits ------------------------------------------------------------------------ */

typedef nvmlReturn_t (*state_edit)(gs_gpu *g, js *gpu_node, void *arg);

/* Re-read the state file under the advisory lock file, let `edit` check the request against it and change
 * the tree, write it back atomically and reload. Caller holds the mutex. */
static nvmlReturn_t edit_state(int gpu, state_edit edit, void *arg)
{
    const char *path = state_path();
    char lockpath[4200], tmp[4200];
    snprintf(lockpath, sizeof(lockpath), "%s.lock", path);
    snprintf(tmp, sizeof(tmp), "%s.gpusim-%d.tmp", path, (int)getpid());
    int lfd = open(lockpath, O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
    if (lfd >= 0)
        flock(lfd, LOCK_EX);
    memset(&cur_stat, 0, sizeof(cur_stat)); /* force a fresh read: another process may have edited it */
    refresh_state();
    nvmlReturn_t ret = NVML_ERROR_UNKNOWN;
    js *node = js_at(js_get(cur->tree, "gpus"), (size_t)gpu);
    if (gpu < cur->ngpus && node)
        ret = edit(&cur->gpu[gpu], node, arg);
    if (ret == NVML_SUCCESS) {
        FILE *f = fopen(tmp, "w");
        if (!f || js_dump(cur->tree, f) || fclose(f) || rename(tmp, path)) {
            if (f)
                unlink(tmp);
            ret = NVML_ERROR_NO_PERMISSION;
        }
        memset(&cur_stat, 0, sizeof(cur_stat));
        refresh_state(); /* rebuild the structs from what was written */
    }
    if (lfd >= 0) {
        flock(lfd, LOCK_UN);
        close(lfd);
    }
    return ret;
}

static js *mig_array(js *gpu_node, const char *key)
{
    js *mig = js_get(gpu_node, "mig");
    if (!mig)
        return NULL;
    js *arr = js_get(mig, key);
    if (!arr) {
        arr = js_new_arr();
        if (js_obj_put(mig, key, arr)) {
            js_free(arr);
            return NULL;
        }
    }
    return arr;
}

struct create_gi_arg {
    unsigned profile_id;
    nvmlGpuInstancePlacement_t placement;
    unsigned out_id;
};

static nvmlReturn_t edit_create_gi(gs_gpu *g, js *node, void *argp)
{
    struct create_gi_arg *a = argp;
    if (!g->mig_capable || g->mig_current != 1)
        return NVML_ERROR_NOT_SUPPORTED;
    const gs_profile *p = profile_by_id(g, a->profile_id);
    if (!p)
        return NVML_ERROR_INVALID_ARGUMENT;
    int legal = 0;
    for (int i = 0; i < p->nplacements; i++)
        if (p->start[i] == a->placement.start && p->size[i] == a->placement.size)
            legal = 1;
    if (!legal)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned same = 0;
    int used[GS_MAX_GI_ID] = {0};
    for (int i = 0; i < g->ngi; i++) {
        const gs_gi *o = &g->gi[i];
        used[o->id] = 1;
        if (o->profile_id == a->profile_id)
            same++;
        if (a->placement.start < o->start + o->size && o->start < a->placement.start + a->placement.size)
            return NVML_ERROR_INSUFFICIENT_RESOURCES;
    }
    if (same >= p->max_instances || g->ngi >= GS_MAX_GI)
        return NVML_ERROR_INSUFFICIENT_RESOURCES;
    unsigned id = 1;
    while (id < GS_MAX_GI_ID && used[id])
        id++;
    if (id >= GS_MAX_GI_ID)
        return NVML_ERROR_INSUFFICIENT_RESOURCES;
    js *arr = mig_array(node, "gpu_instances"), *e = js_new_obj(), *pl = js_new_obj();
    if (!arr || !e || !pl || js_obj_put(pl, "start", js_new_int(a->placement.start)) ||
        js_obj_put(pl, "size", js_new_int(a->placement.size)) || js_obj_put(e, "id", js_new_int(id)) ||
        js_obj_put(e, "profile", js_new_str(p->name)) || js_obj_put(e, "profile_id", js_new_int(p->id)) ||
        js_obj_put(e, "placement", pl)) {
        js_free(e);
        return NVML_ERROR_MEMORY;
    }
    if (js_arr_push(arr, e)) {
        js_free(e);
        return NVML_ERROR_MEMORY;
    }
    a->out_id = id;
    return NVML_SUCCESS;
}

static unsigned long long fnv1a(const char *s, unsigned long long h)
{
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 0x100000001b3ULL;
    }
    return h;
}

struct create_ci_arg {
    unsigned gi, profile;
    unsigned out_ci;
};

static nvmlReturn_t edit_create_ci(gs_gpu *g, js *node, void *argp)
{
    struct create_ci_arg *a = argp;
    gs_gi *gi = g->mig_current == 1 ? gi_by_id(g, a->gi) : NULL;
    if (!gi)
        return NVML_ERROR_INVALID_ARGUMENT;
    const gs_profile *p = profile_by_id(g, gi->profile_id);
    if (!p || ci_profile_for_slices(p->slices) != (int)a->profile)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (int j = 0; j < GS_MAX_MIG; j++)
        if (g->mig[j].present && g->mig[j].gi_id == a->gi)
            return NVML_ERROR_INSUFFICIENT_RESOURCES; /* the one full-size CI exists already */
    int slot = -1;
    for (unsigned j = 0; j < g->mig_max && slot < 0; j++)
        if (!g->mig[j].present)
            slot = (int)j;
    if (slot < 0)
        return NVML_ERROR_INSUFFICIENT_RESOURCES;
    js *mig = js_get(node, "mig");
    long long created = js_int(js_get(mig, "created_instances"), 0) + 1;
    char seed[160], uuid[64];
    snprintf(seed, sizeof(seed), "%s/%lld", g->uuid, created);
    unsigned long long h1 = fnv1a(seed, 0xcbf29ce484222325ULL), h2 = fnv1a(seed, h1 ^ 0x9e3779b97f4a7c15ULL);
    snprintf(uuid, sizeof(uuid), "MIG-%08llx-%04llx-%04llx-%04llx-%012llx", h1 >> 32, (h1 >> 16) & 0xffff,
             h1 & 0xffff, h2 >> 48, h2 & 0xffffffffffffULL);
    js *arr = mig_array(node, "devices"), *e = js_new_obj();
    if (!arr || !e || js_obj_put(e, "index", js_new_int(slot)) || js_obj_put(e, "uuid", js_new_str(uuid)) ||
        js_obj_put(e, "profile", js_new_str(p->name)) || js_obj_put(e, "gi_id", js_new_int(a->gi)) ||
        js_obj_put(e, "ci_id", js_new_int(0)) || js_obj_put(e, "memory_mib", js_new_int((long long)p->memory_mib)) ||
        js_obj_put(e, "sm_count", js_new_int(p->sm_count)) || js_set_int(mig, "created_instances", created)) {
        js_free(e);
        return NVML_ERROR_MEMORY;
    }
    if (js_arr_push(arr, e)) {
        js_free(e);
        return NVML_ERROR_MEMORY;
    }
    a->out_ci = 0;
    return NVML_SUCCESS;
}

struct destroy_arg {
    unsigned gi;
    int ci; /* -1: destroy the GI */
};

static nvmlReturn_t edit_destroy(gs_gpu *g, js *node, void *argp)
{
    struct destroy_arg *a = argp;
    if (g->mig_current != 1 || !gi_by_id(g, a->gi))
        return NVML_ERROR_INVALID_ARGUMENT;
    if (a->ci >= 0) {
        if (!mig_of_gi(g, a->gi, (unsigned)a->ci))
            return NVML_ERROR_INVALID_ARGUMENT;
        if (gi_has_process(g, a->gi, a->ci))
            return NVML_ERROR_IN_USE;
        js *arr = js_get(js_get(node, "mig"), "devices");
        for (size_t i = 0; i < js_len(arr); i++) {
            js *d = js_at(arr, i);
            if (js_int(js_get(d, "gi_id"), -1) == a->gi && js_int(js_get(d, "ci_id"), -1) == a->ci) {
                js_arr_remove(arr, i);
                return NVML_SUCCESS;
            }
        }
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    for (int j = 0; j < GS_MAX_MIG; j++)
        if (g->mig[j].present && g->mig[j].gi_id == a->gi)
            return NVML_ERROR_IN_USE; /* documented: fails while the GI has compute instances */
    if (gi_has_process(g, a->gi, -1))
        return NVML_ERROR_IN_USE;
    js *arr = js_get(js_get(node, "mig"), "gpu_instances");
    for (size_t i = 0; i < js_len(arr); i++) {
        if (js_int(js_get(js_at(arr, i), "id"), -1) == a->gi) {
            js_arr_remove(arr, i);
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_INVALID_ARGUMENT;
}

/* faults.hang_after_functions: the call has done its work (the state file shows it), then blocks,
 * like a driver call that created the instance and never returned to its caller. */
static void maybe_hang_after(const char *fn)
{
    if (listed(fn, cur->hang_after, cur->nhang_after))
        hang_unlock_forever();
}

/* --- profiles and placements ------------------------------------------------------------------ */

static void fill_gi_profile(const gs_profile *p, unsigned *id, unsigned *slices, unsigned *count,
                            unsigned *sms, unsigned long long *mem)
{
    *id = p->id;
    *slices = p->slices;
    *count = p->max_instances;
    *sms = p->sm_count;
    *mem = p->memory_mib;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t device, unsigned int profile,
                                                              nvmlGpuInstanceProfileInfo_t *info)
{
    BEGIN("nvmlDeviceGetGpuInstanceProfileInfo");
    gs_gpu *g;
    nvmlReturn_t r = mig_gpu(device, &g);
    if (r != NVML_SUCCESS)
        END(r);
    if (!info || profile >= NVML_GPU_INSTANCE_PROFILE_COUNT)
        END(NVML_ERROR_INVALID_ARGUMENT);
    const gs_profile *p = profile_by_index(g, profile);
    if (!p)
        END(NVML_ERROR_NOT_SUPPORTED);
    memset(info, 0, sizeof(*info));
    fill_gi_profile(p, &info->id, &info->sliceCount, &info->instanceCount, &info->multiprocessorCount,
                    &info->memorySizeMB);
    info->copyEngineCount = p->slices;
    info->decoderCount = p->slices / 2;
    END(NVML_SUCCESS);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t device, unsigned int profile,
                                                               nvmlGpuInstanceProfileInfo_v2_t *info)
{
    BEGIN("nvmlDeviceGetGpuInstanceProfileInfoV");
    gs_gpu *g;
    nvmlReturn_t r = mig_gpu(device, &g);
    if (r != NVML_SUCCESS)
        END(r);
    if (!info || profile >= NVML_GPU_INSTANCE_PROFILE_COUNT)
        END(NVML_ERROR_INVALID_ARGUMENT);
    if (info->version != nvmlGpuInstanceProfileInfo_v2)
        END(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    const gs_profile *p = profile_by_index(g, profile);
    if (!p)
        END(NVML_ERROR_NOT_SUPPORTED);
    unsigned version = info->version;
    memset(info, 0, sizeof(*info));
    info->version = version;
    fill_gi_profile(p, &info->id, &info->sliceCount, &info->instanceCount, &info->multiprocessorCount,
                    &info->memorySizeMB);
    info->copyEngineCount = p->slices;
    info->decoderCount = p->slices / 2;
    snprintf(info->name, sizeof(info->name), "MIG %s", p->name);
    END(NVML_SUCCESS);
}

/* placements NULL: the count only (documented way to size the array). */
NVML_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(nvmlDevice_t device,
                                                                        unsigned int profileId,
                                                                        nvmlGpuInstancePlacement_t *placements,
                                                                        unsigned int *count)
{
    BEGIN("nvmlDeviceGetGpuInstancePossiblePlacements_v2");
    gs_gpu *g;
    nvmlReturn_t r = mig_gpu(device, &g);
    if (r != NVML_SUCCESS)
        END(r);
    const gs_profile *p = profile_by_id(g, profileId);
    if (!count || !p)
        END(NVML_ERROR_INVALID_ARGUMENT);
    if (placements)
        for (int i = 0; i < p->nplacements; i++) {
            placements[i].start = p->start[i];
            placements[i].size = p->size[i];
        }
    *count = (unsigned)p->nplacements;
    END(NVML_SUCCESS);
}

/* --- GPU instances ---------------------------------------------------------------------------- */

NVML_EXPORT nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(nvmlDevice_t device, unsigned int profileId,
                                                                  const nvmlGpuInstancePlacement_t *placement,
                                                                  nvmlGpuInstance_t *gpuInstance)
{
    pthread_once(&instance_handles_once, init_instance_handles);
    BEGIN("nvmlDeviceCreateGpuInstanceWithPlacement");
    gs_gpu *g;
    nvmlReturn_t r = mig_gpu(device, &g);
    if (r != NVML_SUCCESS)
        END(r);
    if (!placement || !gpuInstance)
        END(NVML_ERROR_INVALID_ARGUMENT);
    struct create_gi_arg a = {profileId, *placement, 0};
    r = edit_state(device->gpu, edit_create_gi, &a);
    if (r != NVML_SUCCESS)
        END(r);
    *gpuInstance = &gi_handles[device->gpu][a.out_id];
    maybe_hang_after("nvmlDeviceCreateGpuInstanceWithPlacement");
    END(NVML_SUCCESS);
}

NVML_EXPORT nvmlReturn_t nvmlGpuInstanceDestroy(nvmlGpuInstance_t gpuInstance)
{
    pthread_once(&instance_handles_once, init_instance_handles);
    BEGIN("nvmlGpuInstanceDestroy");
    gs_gpu *g;
    gs_gi *gi;
    nvmlReturn_t r = resolve_gi(gpuInstance, &g, &gi);
    if (r != NVML_SUCCESS)
        END(r);
    struct destroy_arg a = {gi->id, -1};
    r = edit_state(gpuInstance->gpu, edit_destroy, &a);
    if (r == NVML_SUCCESS)
        maybe_hang_after("nvmlGpuInstanceDestroy");
    END(r);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstances(nvmlDevice_t device, unsigned int profileId,
                                                   nvmlGpuInstance_t *gpuInstances, unsigned int *count)
{
    pthread_once(&instance_handles_once, init_instance_handles);
    BEGIN("nvmlDeviceGetGpuInstances");
    gs_gpu *g;
    nvmlReturn_t r = mig_gpu(device, &g);
    if (r != NVML_SUCCESS)
        END(r);
    if (!gpuInstances || !count || !profile_by_id(g, profileId))
        END(NVML_ERROR_INVALID_ARGUMENT);
    unsigned n = 0;
    for (int i = 0; i < g->ngi; i++)
        if (g->gi[i].profile_id == profileId)
            gpuInstances[n++] = &gi_handles[device->gpu][g->gi[i].id];
    *count = n;
    END(NVML_SUCCESS);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned int id,
                                                      nvmlGpuInstance_t *gpuInstance)
{
    pthread_once(&instance_handles_once, init_instance_handles);
    BEGIN("nvmlDeviceGetGpuInstanceById");
    gs_gpu *g;
    nvmlReturn_t r = mig_gpu(device, &g);
    if (r != NVML_SUCCESS)
        END(r);
    if (!gpuInstance || id >= GS_MAX_GI_ID)
        END(NVML_ERROR_INVALID_ARGUMENT);
    if (!gi_by_id(g, id))
        END(NVML_ERROR_NOT_FOUND);
    *gpuInstance = &gi_handles[device->gpu][id];
    END(NVML_SUCCESS);
}

NVML_EXPORT nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gpuInstance, nvmlGpuInstanceInfo_t *info)
{
    pthread_once(&instance_handles_once, init_instance_handles);
    BEGIN("nvmlGpuInstanceGetInfo");
    gs_gpu *g;
    gs_gi *gi;
    nvmlReturn_t r = resolve_gi(gpuInstance, &g, &gi);
    if (r != NVML_SUCCESS)
        END(r);
    if (!info)
        END(NVML_ERROR_INVALID_ARGUMENT);
    info->device = &gpu_handles[gpuInstance->gpu];
    info->id = gi->id;
    info->profileId = gi->profile_id;
    info->placement.start = gi->start;
    info->placement.size = gi->size;
    END(NVML_SUCCESS);
}

/* --- compute instances ------------------------------------------------------------------------- */

static nvmlReturn_t ci_profile_info(nvmlGpuInstance_t gpuInstance, unsigned profile, unsigned engProfile,
                                    unsigned *id, unsigned *slices, unsigned *count, unsigned *sms)
{
    gs_gpu *g;
    gs_gi *gi;
    nvmlReturn_t r = resolve_gi(gpuInstance, &g, &gi);
    if (r != NVML_SUCCESS)
        return r;
    if (profile >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT || engProfile != NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
        return NVML_ERROR_INVALID_ARGUMENT;
    const gs_profile *p = profile_by_id(g, gi->profile_id);
    if (!p || ci_profile_for_slices(p->slices) != (int)profile)
        return NVML_ERROR_NOT_SUPPORTED; /* gap: only the CI that spans the whole GI */
    *id = profile;
    *slices = p->slices;
    *count = 1;
    *sms = p->sm_count;
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(nvmlGpuInstance_t gpuInstance,
                                                                      unsigned int profile,
                                                                      unsigned int engProfile,
                                                                      nvmlComputeInstanceProfileInfo_t *info)
{
    pthread_once(&instance_handles_once, init_instance_handles);
    BEGIN("nvmlGpuInstanceGetComputeInstanceProfileInfo");
    if (!info)
        END(NVML_ERROR_INVALID_ARGUMENT);
    memset(info, 0, sizeof(*info));
    END(ci_profile_info(gpuInstance, profile, engProfile, &info->id, &info->sliceCount, &info->instanceCount,
                        &info->multiprocessorCount));
}

NVML_EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfoV(nvmlGpuInstance_t gpuInstance,
                                                                       unsigned int profile,
                                                                       unsigned int engProfile,
                                                                       nvmlComputeInstanceProfileInfo_v2_t *info)
{
    pthread_once(&instance_handles_once, init_instance_handles);
    BEGIN("nvmlGpuInstanceGetComputeInstanceProfileInfoV");
    if (!info)
        END(NVML_ERROR_INVALID_ARGUMENT);
    if (info->version != nvmlComputeInstanceProfileInfo_v2)
        END(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    unsigned version = info->version;
    memset(info, 0, sizeof(*info));
    info->version = version;
    nvmlReturn_t r = ci_profile_info(gpuInstance, profile, engProfile, &info->id, &info->sliceCount,
                                     &info->instanceCount, &info->multiprocessorCount);
    if (r == NVML_SUCCESS)
        snprintf(info->name, sizeof(info->name), "MIG %uc", info->sliceCount);
    END(r);
}

NVML_EXPORT nvmlReturn_t nvmlGpuInstanceCreateComputeInstance(nvmlGpuInstance_t gpuInstance, unsigned int profileId,
                                                              nvmlComputeInstance_t *computeInstance)
{
    pthread_once(&instance_handles_once, init_instance_handles);
    BEGIN("nvmlGpuInstanceCreateComputeInstance");
    gs_gpu *g;
    gs_gi *gi;
    nvmlReturn_t r = resolve_gi(gpuInstance, &g, &gi);
    if (r != NVML_SUCCESS)
        END(r);
    if (!computeInstance)
        END(NVML_ERROR_INVALID_ARGUMENT);
    struct create_ci_arg a = {gi->id, profileId, 0};
    r = edit_state(gpuInstance->gpu, edit_create_ci, &a);
    if (r != NVML_SUCCESS)
        END(r);
    *computeInstance = &ci_handles[gpuInstance->gpu][a.gi][a.out_ci];
    maybe_hang_after("nvmlGpuInstanceCreateComputeInstance");
    END(NVML_SUCCESS);
}

NVML_EXPORT nvmlReturn_t nvmlComputeInstanceDestroy(nvmlComputeInstance_t computeInstance)
{
    pthread_once(&instance_handles_once, init_instance_handles);
    BEGIN("nvmlComputeInstanceDestroy");
    gs_gpu *g;
    gs_gi *gi;
    gs_mig *m;
    nvmlReturn_t r = resolve_ci(computeInstance, &g, &gi, &m);
    if (r != NVML_SUCCESS)
        END(r);
    struct destroy_arg a = {computeInstance->gi, (int)computeInstance->ci};
    r = edit_state(computeInstance->gpu, edit_destroy, &a);
    if (r == NVML_SUCCESS)
        maybe_hang_after("nvmlComputeInstanceDestroy");
    END(r);
}

NVML_EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstances(nvmlGpuInstance_t gpuInstance, unsigned int profileId,
                                                            nvmlComputeInstance_t *computeInstances,
                                                            unsigned int *count)
{
    pthread_once(&instance_handles_once, init_instance_handles);
    BEGIN("nvmlGpuInstanceGetComputeInstances");
    gs_gpu *g;
    gs_gi *gi;
    nvmlReturn_t r = resolve_gi(gpuInstance, &g, &gi);
    if (r != NVML_SUCCESS)
        END(r);
    if (!computeInstances || !count || profileId >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT)
        END(NVML_ERROR_INVALID_ARGUMENT);
    const gs_profile *p = profile_by_id(g, gi->profile_id);
    unsigned n = 0;
    for (int j = 0; j < GS_MAX_MIG; j++)
        if (p && ci_profile_for_slices(p->slices) == (int)profileId && g->mig[j].present &&
            g->mig[j].gi_id == gi->id && g->mig[j].ci_id < GS_MAX_MIG)
            computeInstances[n++] = &ci_handles[gpuInstance->gpu][gi->id][g->mig[j].ci_id];
    *count = n;
    END(NVML_SUCCESS);
}

NVML_EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(nvmlGpuInstance_t gpuInstance, unsigned int id,
                                                               nvmlComputeInstance_t *computeInstance)
{
    pthread_once(&instance_handles_once, init_instance_handles);
    BEGIN("nvmlGpuInstanceGetComputeInstanceById");
    gs_gpu *g;
    gs_gi *gi;
    nvmlReturn_t r = resolve_gi(gpuInstance, &g, &gi);
    if (r != NVML_SUCCESS)
        END(r);
    if (!computeInstance || id >= GS_MAX_MIG)
        END(NVML_ERROR_INVALID_ARGUMENT);
    if (!mig_of_gi(g, gi->id, id))
        END(NVML_ERROR_NOT_FOUND);
    *computeInstance = &ci_handles[gpuInstance->gpu][gi->id][id];
    END(NVML_SUCCESS);
}

NVML_EXPORT nvmlReturn_t nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t computeInstance,
                                                       nvmlComputeInstanceInfo_t *info)
{
    pthread_once(&instance_handles_once, init_instance_handles);
    BEGIN("nvmlComputeInstanceGetInfo_v2");
    gs_gpu *g;
    gs_gi *gi;
    gs_mig *m;
    nvmlReturn_t r = resolve_ci(computeInstance, &g, &gi, &m);
    if (r != NVML_SUCCESS)
        END(r);
    if (!info)
        END(NVML_ERROR_INVALID_ARGUMENT);
    const gs_profile *p = profile_by_id(g, gi->profile_id);
    info->device = &gpu_handles[computeInstance->gpu];
    info->gpuInstance = &gi_handles[computeInstance->gpu][gi->id];
    info->id = m->ci_id;
    info->profileId = p ? (unsigned)ci_profile_for_slices(p->slices) : 0;
    info->placement.start = 0;
    info->placement.size = p ? p->slices : m->slices;
    END(NVML_SUCCESS);
}

NVML_EXPORT nvmlReturn_t nvmlComputeInstanceGetInfo(nvmlComputeInstance_t computeInstance,
                                                    nvmlComputeInstanceInfo_t *info)
{
    return nvmlComputeInstanceGetInfo_v2(computeInstance, info);
}
