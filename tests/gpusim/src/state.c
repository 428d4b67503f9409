/* gpusim: translate the state document into the structs the NVML entry points read. */
#include "state.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nvml_sim.h"

static void copy_str(char *dst, size_t n, const char *src)
{
    snprintf(dst, n, "%s", src ? src : "");
}

static unsigned parse_hex(const char *s, unsigned dflt)
{
    if (!s || !*s)
        return dflt;
    return (unsigned)strtoul(s, NULL, 16);
}

static int compute_mode_of(const char *s)
{
    if (!s || !strcmp(s, "Default"))
        return NVML_COMPUTEMODE_DEFAULT;
    if (!strcmp(s, "Exclusive_Process"))
        return NVML_COMPUTEMODE_EXCLUSIVE_PROCESS;
    if (!strcmp(s, "Prohibited"))
        return NVML_COMPUTEMODE_PROHIBITED;
    return NVML_COMPUTEMODE_DEFAULT;
}

/* "3g.48gb" -> 3 (GPU instance slices, as in nvidia-smi profile names). */
static unsigned slices_of(const char *profile)
{
    unsigned n = (unsigned)strtoul(profile, NULL, 10);
    return n ? n : 1;
}

/* NVML_GPU_INSTANCE_PROFILE_* of a catalog entry: by GPU slices, memory slices and the media-engine
 * suffix, as NVML numbers them (nvml.h; pynvml's constants). */
static int nvml_profile_index(const char *name, unsigned slices, unsigned memory_slices)
{
    int me = strstr(name, "+me") != NULL;
    switch (slices) {
    case 1:
        if (me)
            return 7;                        /* 1_SLICE_REV1 (1g.Xgb+me) */
        return memory_slices >= 2 ? 9 : 0;   /* 1_SLICE_REV2 (1g with 2 memory slices), 1_SLICE */
    case 2: return me ? 8 : 1;               /* 2_SLICE_REV1, 2_SLICE */
    case 3: return 2;
    case 4: return 3;
    case 6: return 6;
    case 7: return 4;
    case 8: return 5;
    default: return -1;
    }
}

static int load_profiles(js *catalog, gs_gpu *out, char *err, size_t errlen)
{
    for (size_t j = 0; j < js_len(catalog) && out->nprofiles < GS_MAX_PROFILES; j++) {
        js *e = js_at(catalog, j);
        gs_profile *p = &out->profiles[out->nprofiles];
        memset(p, 0, sizeof(*p));
        copy_str(p->name, sizeof(p->name), js_str(js_get(e, "name"), ""));
        p->id = (unsigned)js_int(js_get(e, "profile_id"), 0);
        p->slices = (unsigned)js_int(js_get(e, "slices"), 0);
        p->memory_slices = (unsigned)js_int(js_get(e, "memory_slices"), p->slices);
        p->memory_mib = (unsigned long long)js_int(js_get(e, "memory_mib"), 0);
        p->max_instances = (unsigned)js_int(js_get(e, "max_instances"), 1);
        p->sm_count = (unsigned)js_int(js_get(e, "sm_count"), 0);
        int idx = nvml_profile_index(p->name, p->slices, p->memory_slices);
        if (!p->name[0] || idx < 0) {
            snprintf(err, errlen, "mig_profiles entry %zu (%s): unknown slice count %u", j, p->name, p->slices);
            return -1;
        }
        p->nvml_index = (unsigned)idx;
        js *pls = js_get(e, "placements");
        for (size_t k = 0; k < js_len(pls) && p->nplacements < GS_MAX_PLACEMENTS; k++) {
            p->start[p->nplacements] = (unsigned)js_int(js_get(js_at(pls, k), "start"), 0);
            p->size[p->nplacements] = (unsigned)js_int(js_get(js_at(pls, k), "size"), 0);
            p->nplacements++;
        }
        out->nprofiles++;
    }
    return 0;
}

static int load_gpu(js *g, int i, gs_gpu *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof(*out));
    const char *uuid = js_str(js_get(g, "uuid"), NULL);
    const char *name = js_str(js_get(g, "name"), NULL);
    const char *bus = js_str(js_get(g, "pci_bus_id"), NULL);
    if (!uuid || !name || !bus) {
        snprintf(err, errlen, "gpus[%d] needs string fields uuid, name and pci_bus_id", i);
        return -1;
    }
    if (js_int(js_get(g, "index"), -1) != i) {
        snprintf(err, errlen, "gpus[%d].index must be %d", i, i);
        return -1;
    }
    copy_str(out->uuid, sizeof(out->uuid), uuid);
    copy_str(out->name, sizeof(out->name), name);
    copy_str(out->serial, sizeof(out->serial), js_str(js_get(g, "serial"), "0"));
    copy_str(out->bus_id, sizeof(out->bus_id), bus);
    if (sscanf(bus, "%x:%x:%x.%x", &out->domain, &out->bus, &out->device, &out->function) != 4) {
        snprintf(err, errlen, "gpus[%d].pci_bus_id %s is not DDDDDDDD:BB:DD.F", i, bus);
        return -1;
    }
    out->pci_device_id = parse_hex(js_str(js_get(g, "pci_device_id"), NULL), 0x10DE);
    out->pci_subsystem_id = parse_hex(js_str(js_get(g, "pci_subsystem_id"), NULL), 0);
    out->numa_node = (int)js_int(js_get(g, "numa_node"), -1);
    out->minor = (unsigned)js_int(js_get(g, "minor_number"), i);
    out->memory_total_mib = (unsigned long long)js_int(js_get(g, "memory_total_mib"), 0);
    out->memory_used_mib = (unsigned long long)js_int(js_get(g, "memory_used_mib"), 0);
    out->memory_info_supported = js_bool(js_get(g, "memory_info_supported"), 1);
    out->cores = (unsigned)js_int(js_get(g, "cores"), 0);
    js *cc = js_get(g, "compute_capability");
    out->cc_major = (int)js_int(js_at(cc, 0), 0);
    out->cc_minor = (int)js_int(js_at(cc, 1), 0);
    out->architecture = (unsigned)js_int(js_get(g, "architecture"), 0);
    out->persistence_mode = js_bool(js_get(g, "persistence_mode"), 0);
    out->compute_mode = compute_mode_of(js_str(js_get(g, "compute_mode"), NULL));
    out->util_gpu = (unsigned)js_int(js_get(g, "utilization_gpu"), 0);
    out->util_mem = (unsigned)js_int(js_get(g, "utilization_memory"), 0);
    out->temperature_c = (unsigned)js_int(js_get(g, "temperature_c"), 0);
    out->power_mw = (unsigned)(js_num(js_get(g, "power_draw_w"), 0) * 1000.0);
    out->power_limit_mw = (unsigned)(js_num(js_get(g, "power_limit_w"), 0) * 1000.0);
    out->lost = js_bool(js_get(g, "lost"), 0);

    js *mig = js_get(g, "mig");
    out->mig_capable = js_bool(js_get(mig, "capable"), 0);
    out->mig_current = (int)js_int(js_get(mig, "current"), 0);
    out->mig_pending = (int)js_int(js_get(mig, "pending"), out->mig_current);
    out->mig_max = (unsigned)js_int(js_get(mig, "max_devices"), 7);
    if (out->mig_max > GS_MAX_MIG)
        out->mig_max = GS_MAX_MIG;
    js *devs = js_get(mig, "devices");
    for (size_t j = 0; j < js_len(devs); j++) {
        js *d = js_at(devs, j);
        long long idx = js_int(js_get(d, "index"), (long long)j);
        if (idx < 0 || idx >= GS_MAX_MIG) {
            snprintf(err, errlen, "gpus[%d].mig.devices[%zu].index %lld out of range 0..%d", i, j, idx,
                     GS_MAX_MIG - 1);
            return -1;
        }
        gs_mig *m = &out->mig[idx];
        if (m->present) {
            snprintf(err, errlen, "gpus[%d].mig.devices: index %lld used twice", i, idx);
            return -1;
        }
        const char *muuid = js_str(js_get(d, "uuid"), NULL);
        if (!muuid) {
            snprintf(err, errlen, "gpus[%d].mig.devices[%zu] lacks uuid", i, j);
            return -1;
        }
        m->present = 1;
        m->index = (int)idx;
        copy_str(m->uuid, sizeof(m->uuid), muuid);
        copy_str(m->profile, sizeof(m->profile), js_str(js_get(d, "profile"), "1g"));
        m->gi_id = (unsigned)js_int(js_get(d, "gi_id"), 0);
        m->ci_id = (unsigned)js_int(js_get(d, "ci_id"), 0);
        m->memory_mib = (unsigned long long)js_int(js_get(d, "memory_mib"), 0);
        m->sm_count = (unsigned)js_int(js_get(d, "sm_count"), 0);
        m->slices = slices_of(m->profile);
    }

    js *gis = js_get(mig, "gpu_instances");
    for (size_t j = 0; j < js_len(gis) && out->ngi < GS_MAX_GI; j++) {
        js *e = js_at(gis, j);
        gs_gi *gi = &out->gi[out->ngi++];
        gi->id = (unsigned)js_int(js_get(e, "id"), 0);
        if (gi->id >= GS_MAX_GI_ID) {
            snprintf(err, errlen, "gpus[%d].mig.gpu_instances[%zu].id %u out of range 0..%d", i, j, gi->id,
                     GS_MAX_GI_ID - 1);
            return -1;
        }
        copy_str(gi->profile, sizeof(gi->profile), js_str(js_get(e, "profile"), ""));
        gi->profile_id = (unsigned)js_int(js_get(e, "profile_id"), 0);
        gi->start = (unsigned)js_int(js_get(js_get(e, "placement"), "start"), 0);
        gi->size = (unsigned)js_int(js_get(js_get(e, "placement"), "size"), 0);
    }

    js *xids = js_get(g, "xid_events");
    for (size_t j = 0; j < js_len(xids) && out->nxid < GS_MAX_XID; j++) {
        js *e = js_at(xids, j);
        gs_xid *x = &out->xid[out->nxid++];
        x->seq = (unsigned long long)js_int(js_get(e, "seq"), (long long)j + 1);
        x->xid = (unsigned)js_int(js_get(e, "xid"), 0);
        x->gi_id = js_is_null(js_get(e, "gi_id")) ? NVML_VALUE_NOT_AVAILABLE_UINT
                                                  : (unsigned)js_int(js_get(e, "gi_id"), 0);
        x->ci_id = js_is_null(js_get(e, "ci_id")) ? NVML_VALUE_NOT_AVAILABLE_UINT
                                                  : (unsigned)js_int(js_get(e, "ci_id"), 0);
    }

    js *procs = js_get(g, "processes");
    for (size_t j = 0; j < js_len(procs) && out->nproc < GS_MAX_PROC; j++) {
        js *p = js_at(procs, j);
        gs_proc *pr = &out->proc[out->nproc++];
        pr->pid = (unsigned)js_int(js_get(p, "pid"), 0);
        pr->used_mib = (unsigned long long)js_int(js_get(p, "used_memory_mib"), 0);
        pr->gi_id = js_is_null(js_get(p, "gi_id")) ? NVML_VALUE_NOT_AVAILABLE_UINT
                                                   : (unsigned)js_int(js_get(p, "gi_id"), 0);
        pr->ci_id = js_is_null(js_get(p, "ci_id")) ? NVML_VALUE_NOT_AVAILABLE_UINT
                                                   : (unsigned)js_int(js_get(p, "ci_id"), 0);
    }
    return 0;
}

int gs_state_from_json(js *doc, gs_state *st, char *err, size_t errlen)
{
    memset(st, 0, sizeof(*st));
    if (!doc || doc->t != JS_OBJ) {
        snprintf(err, errlen, "top level must be a JSON object");
        return -1;
    }
    if (js_int(js_get(doc, "schema"), -1) != 1) {
        snprintf(err, errlen, "field 'schema' must be 1");
        return -1;
    }
    const char *drv = js_str(js_get(doc, "driver_version"), NULL);
    if (!drv) {
        snprintf(err, errlen, "field 'driver_version' must be a string");
        return -1;
    }
    copy_str(st->driver_version, sizeof(st->driver_version), drv);
    copy_str(st->nvml_version, sizeof(st->nvml_version), js_str(js_get(doc, "nvml_version"), drv));
    copy_str(st->module_version, sizeof(st->module_version), js_str(js_get(doc, "module_version"), drv));
    st->cuda_driver_version = (int)js_int(js_get(doc, "cuda_driver_version"), 0);
    st->driver_loaded = js_bool(js_get(doc, "driver_loaded"), 1);
    js *faults = js_get(doc, "faults");
    st->init_hang = js_bool(js_get(faults, "init_hang"), 0);
    st->known_bad_driver_hang = js_bool(js_get(faults, "known_bad_driver_hang"), 1);
    st->hang_after_calls = js_int(js_get(faults, "hang_after_calls"), -1);
    copy_str(st->hang_file, sizeof(st->hang_file), js_str(js_get(faults, "hang_file"), ""));
    js *fns = js_get(faults, "hang_functions");
    for (size_t i = 0; i < js_len(fns) && st->nhangfn < GS_MAX_HANGFN; i++) {
        const char *s = js_str(js_at(fns, i), NULL);
        if (s)
            copy_str(st->hangfn[st->nhangfn++], sizeof(st->hangfn[0]), s);
    }
    js *unsup = js_get(faults, "unsupported_functions");
    for (size_t i = 0; i < js_len(unsup) && st->nunsupported < GS_MAX_HANGFN; i++) {
        const char *s = js_str(js_at(unsup, i), NULL);
        if (s)
            copy_str(st->unsupported[st->nunsupported++], sizeof(st->unsupported[0]), s);
    }
    js *gpus = js_get(doc, "gpus");
    if (!gpus || gpus->t != JS_ARR) {
        snprintf(err, errlen, "field 'gpus' must be a list");
        return -1;
    }
    if (js_len(gpus) > GS_MAX_GPUS) {
        snprintf(err, errlen, "at most %d GPUs are simulated", GS_MAX_GPUS);
        return -1;
    }
    js *hang_after = js_get(faults, "hang_after_functions");
    for (size_t i = 0; i < js_len(hang_after) && st->nhang_after < GS_MAX_HANGFN; i++) {
        const char *s = js_str(js_at(hang_after, i), NULL);
        if (s)
            copy_str(st->hang_after[st->nhang_after++], sizeof(st->hang_after[0]), s);
    }
    js *catalogs = js_get(doc, "mig_profiles");
    for (size_t i = 0; i < js_len(gpus); i++) {
        if (load_gpu(js_at(gpus, i), (int)i, &st->gpu[i], err, errlen))
            return -1;
        if (load_profiles(js_get(catalogs, st->gpu[i].name), &st->gpu[i], err, errlen))
            return -1;
    }
    st->ngpus = (int)js_len(gpus);
    st->tree = doc;
    return 0;
}
