/* gpusim: in-memory model of the state file (tests/gpusim/README.md), re-read when the file changes. */
#ifndef GPUSIM_STATE_H
#define GPUSIM_STATE_H

#include "json.h"

#define GS_MAX_GPUS 16
#define GS_MAX_MIG 8
#define GS_MAX_XID 64
#define GS_MAX_PROC 32
#define GS_MAX_HANGFN 32
#define GS_MAX_GI 16       /* GPU instances per GPU (A100/H100: at most 7 at once) */
#define GS_MAX_GI_ID 32    /* GPU instance IDs are below this */
#define GS_MAX_PROFILES 16 /* GPU instance profiles in a model's catalog */
#define GS_MAX_PLACEMENTS 8

/* One GPU instance profile of the GPU's model (top-level "mig_profiles" catalog, NVIDIA's MIG user
 * guide tables). nvml_index is the NVML_GPU_INSTANCE_PROFILE_* constant nvmlDeviceGetGpuInstanceProfileInfo
 * takes; id is the profile ID NVML reports (nvidia-smi's "ID" column). */
typedef struct {
    char name[32];
    unsigned nvml_index, id;
    unsigned slices, memory_slices, max_instances, sm_count;
    unsigned long long memory_mib;
    int nplacements;
    unsigned start[GS_MAX_PLACEMENTS], size[GS_MAX_PLACEMENTS];
} gs_profile;

typedef struct {
    unsigned id;
    char profile[32];
    unsigned profile_id;
    unsigned start, size;
} gs_gi;

typedef struct {
    int present;
    int index;
    char uuid[96];
    char profile[32];
    unsigned gi_id, ci_id;
    unsigned long long memory_mib;
    unsigned sm_count;
    unsigned slices;
} gs_mig;

typedef struct {
    unsigned long long seq;
    unsigned xid;
    unsigned gi_id, ci_id; /* NVML_VALUE_NOT_AVAILABLE_UINT when the event is for the whole GPU */
} gs_xid;

typedef struct {
    unsigned pid;
    unsigned long long used_mib;
    unsigned gi_id, ci_id;
} gs_proc;

typedef struct {
    char uuid[96];
    char name[96];
    char serial[32];
    char bus_id[32];
    unsigned pci_device_id, pci_subsystem_id;
    unsigned domain, bus, device, function;
    int numa_node;
    unsigned minor;
    unsigned long long memory_total_mib, memory_used_mib;
    int memory_info_supported;
    unsigned cores;
    int cc_major, cc_minor;
    unsigned architecture;
    int persistence_mode;
    int compute_mode;
    unsigned util_gpu, util_mem;
    unsigned temperature_c;
    unsigned power_mw, power_limit_mw;
    int lost;
    int mig_capable, mig_current, mig_pending;
    unsigned mig_max;
    gs_mig mig[GS_MAX_MIG]; /* slot = MIG device index */
    int ngi;
    gs_gi gi[GS_MAX_GI]; /* mig.gpu_instances */
    int nprofiles;
    gs_profile profiles[GS_MAX_PROFILES]; /* the catalog of this GPU's model */
    int nxid;
    gs_xid xid[GS_MAX_XID];
    int nproc;
    gs_proc proc[GS_MAX_PROC];
} gs_gpu;

typedef struct {
    js *tree; /* the parsed document, kept so nvmlDeviceSetMigMode can write it back */
    char driver_version[80];
    char nvml_version[80];
    char module_version[80];
    int cuda_driver_version;
    int driver_loaded;
    int init_hang;
    int known_bad_driver_hang;
    long long hang_after_calls; /* -1: off */
    int nhangfn;
    char hangfn[GS_MAX_HANGFN][64];
    char hang_file[512]; /* non-empty: a hung call blocks in read() of this file (D-state model) */
    int nunsupported;
    char unsupported[GS_MAX_HANGFN][64]; /* these calls return NOT_SUPPORTED (older driver) */
    int nhang_after;
    char hang_after[GS_MAX_HANGFN][64]; /* these calls do their work (state written), then block */
    int ngpus;
    gs_gpu gpu[GS_MAX_GPUS];
} gs_state;

/* Build a state from a parsed document; on error returns -1 and writes why into err. */
int gs_state_from_json(js *doc, gs_state *st, char *err, size_t errlen);

#endif
