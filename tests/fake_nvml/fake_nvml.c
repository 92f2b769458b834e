/*
 * A fake libnvidia-ml.so.1 for tests: real pynvml loads it through ctypes exactly as it
 * loads the driver's library, so the exporter's NVML backend runs its production path.
 *
 * State comes from a line-based config file named by $FAKE_NVML_CONFIG, read when
 * nvmlInitWithFlags moves the reference count from 0 to 1 (so a process can shut down and
 * re-init with new state). tests/fake_nvml/__init__.py writes that file from a scenario
 * YAML; docs/testing.md ("Fake NVML") documents the keys and the tick clock.
 *
 * Semantics follow nvml.h: reference-counted init, NVML_ERROR_UNINITIALIZED before init,
 * the two-call size probe of the running-process lists and of process utilization,
 * NVML_ERROR_NOT_FOUND when no utilization sample is newer than lastSeenTimeStamp, and
 * NVML_VALUE_NOT_AVAILABLE for memory the driver cannot report. MIG: a card with MIG devices is
 * in MIG mode; its MIG handles answer identity, memory, processes and instance ids, and the
 * calls NVML refuses in MIG mode return NVML's codes (see docs/testing.md, "MIG"). The health
 * calls (energy, PCIe, retired pages, row remapping, NVLink, GPM, ...) read the scenario keys of
 * the same names; they are grouped in one section below.
 *
 * Build: gcc -shared -fPIC -fvisibility=hidden -pthread -Wl,-soname,libnvidia-ml.so.1
 *        [-DOLD_DRIVER] -o DIR/libnvidia-ml.so.1 fake_nvml.c
 * OLD_DRIVER leaves out the symbols newer than driver 510 (the _v3 process lists,
 * nvmlDeviceGetCurrentClocksEventReasons, nvmlDeviceGetMemoryInfo_v2, the nvmlGpm* calls of
 * R520) so that dlsym fails as on an old driver.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define EXPORT __attribute__((visibility("default")))

/* ---- nvml.h types (layouts as in nvml.h and pynvml's ctypes Structures) ---- */

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_ALREADY_INITIALIZED = 5,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_INSUFFICIENT_POWER = 8,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_IRQ_ISSUE = 11,
    NVML_ERROR_LIBRARY_NOT_FOUND = 12,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_CORRUPTED_INFOROM = 14,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_RESET_REQUIRED = 16,
    NVML_ERROR_OPERATING_SYSTEM = 17,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
    NVML_ERROR_IN_USE = 19,
    NVML_ERROR_MEMORY = 20,
    NVML_ERROR_NO_DATA = 21,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

#define NVML_VALUE_NOT_AVAILABLE_ULL 0xFFFFFFFFFFFFFFFFULL
#define NVML_NO_INSTANCE 0xFFFFFFFFu /* gpuInstanceId/computeInstanceId with MIG off */
#define NVML_EVENT_TYPE_XID_CRITICAL_ERROR 0x8ULL

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

/* nvmlMemory_v2_t: "used" excludes "reserved" here, where v1's includes it */
typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;
/* NVML_STRUCT_VERSION(Memory, 2): the struct size in the low bits, the version in the top byte */
#define NVML_MEMORY_V2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2u << 24)))
#define NVML_DEVICE_MIG_DISABLE 0u
#define NVML_DEVICE_MIG_ENABLE 1u

typedef struct {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

typedef struct {
    char busIdLegacy[16];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

/* nvmlProcessInfo_v2_t; the _v3 calls take nvmlProcessInfo_t, which has the same layout. */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t;

typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil;
    unsigned int memUtil;
    unsigned int encUtil;
    unsigned int decUtil;
} nvmlProcessUtilizationSample_t;

struct fake_device;
typedef struct fake_device *nvmlDevice_t;
struct fake_event_set;
typedef struct fake_event_set *nvmlEventSet_t;

typedef union {
    double dVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    long long sllVal;
    int siVal;
    unsigned short usVal;
} nvmlValue_t;

typedef struct {
    unsigned int fieldId;
    unsigned int scopeId;
    long long timestamp;
    long long latencyUsec;
    int valueType;
    nvmlReturn_t nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;

/* GPM (nvml.h, R520+): an opaque sample handle and the metrics request */
struct fake_gpm_sample;
typedef struct fake_gpm_sample *nvmlGpmSample_t;
#define NVML_GPM_METRIC_MAX 477 /* pynvml 13's; the caller allocates the array, the fake reads numMetrics */
#define NVML_GPM_METRICS_GET_VERSION 1u
#define NVML_GPM_SUPPORT_VERSION 1u

typedef struct {
    unsigned int metricId;
    nvmlReturn_t nvmlReturn;
    double value;
    struct {
        char *shortName;
        char *longName;
        char *unit;
    } metricInfo;
} nvmlGpmMetric_t;

typedef struct {
    unsigned int version;
    unsigned int numMetrics;
    nvmlGpmSample_t sample1;
    nvmlGpmSample_t sample2;
    nvmlGpmMetric_t metrics[NVML_GPM_METRIC_MAX];
} nvmlGpmMetricsGet_t;

typedef struct {
    unsigned int version;
    unsigned int isSupportedDevice;
} nvmlGpmSupport_t;

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;

/* ---- fake state ---- */

#define MAX_DEVICES 16
#define MAX_MIG_DEVICES 64 /* MIG devices of all cards together */
#define MIG_SLOTS 7 /* nvmlDeviceGetMaxMigDeviceCount of an A100 / H100 (more if a card lists more) */
#define MAX_PROCS 256
#define MAX_XIDS 32
#define MAX_EVENT_SETS 8
#define UTIL_BUFFER_TICKS 8 /* the driver keeps a bounded sample history */
#define TICK_US 1000000ULL /* sample timeStamp of tick t is t * TICK_US (as exporter/node/simulate.py) */
#define DEFAULT_CUDA_DRIVER_VERSION 12040 /* CUDA 12.4, what driver 550 reports */
#define CODEC_PERIOD_US 167000u
#define NVLINK_MAX_LINKS 18 /* NVML_NVLINK_MAX_LINKS of a 550 driver's nvml.h (pynvml 13 says 36) */
#define MAX_GPM_SAMPLES 256 /* two per card or GPU instance: 8 cards x 7 instances fit */

enum field {
    F_POWER,
    F_TEMPERATURE,
    F_UTILIZATION,
    F_CLOCKS,
    F_ECC,
    F_ENCODER,
    F_DECODER,
    F_CLOCKS_EVENT_REASONS,
    F_PROCESS_UTILIZATION,
    F_MEMORY,
    F_EVENTS, /* GetSupportedEventTypes without Xid, RegisterEvents NOT_SUPPORTED */
    F_MIG,    /* a board without MIG: GetMigMode NOT_SUPPORTED */
    /* health (issue 18): the not_supported name is the scenario key */
    F_ENERGY,
    F_POWER_LIMIT,
    F_FAN,
    F_PSTATE,
    F_MEMORY_TEMP,
    F_MEMORY_RESERVED,
    F_PCIE_TX,
    F_PCIE_RX,
    F_PCIE_REPLAY,
    F_PCIE_GEN,
    F_PCIE_WIDTH,
    F_RETIRED_SBE,
    F_RETIRED_DBE,
    F_RETIRED_PENDING,
    F_REMAP_CORR,
    F_REMAP_UNC,
    F_REMAP_PENDING,
    F_REMAP_FAILURE,
    F_POWER_VIOLATION,
    F_NVLINKS,
    F_GPM,
    F_COUNT
};
static const char *const field_names[F_COUNT] = {
    "power", "temperature", "utilization", "clocks", "ecc", "encoder", "decoder",
    "clocks_event_reasons", "process_utilization", "memory", "events", "mig",
    "energy_millijoules", "power_limit_milliwatts", "fan_speed_percent", "performance_state",
    "memory_temperature_celsius", "memory_reserved_bytes", "pcie_tx_kilobytes_per_second",
    "pcie_rx_kilobytes_per_second", "pcie_replay_count", "pcie_link_generation", "pcie_link_width",
    "retired_pages_single_bit", "retired_pages_double_bit", "retired_pages_pending",
    "remapped_rows_correctable", "remapped_rows_uncorrectable", "remapped_rows_pending",
    "remapped_rows_failure", "power_violation_nanoseconds", "nvlinks", "gpm",
};

/* Configured values; a value absent from the config makes its call NOT_SUPPORTED. */
enum value {
    V_MEMORY_TOTAL,
    V_MEMORY_USED,
    V_UTIL_GPU,
    V_UTIL_MEMORY,
    V_POWER,
    V_TEMPERATURE,
    V_SM_CLOCK,
    V_MEMORY_CLOCK,
    V_ENCODER,
    V_DECODER,
    V_ECC_CORRECTED,
    V_ECC_UNCORRECTED,
    V_CLOCKS_EVENT_REASONS,
    /* health (issue 18): each V_x has the F_x of the same name */
    V_ENERGY,
    V_POWER_LIMIT,
    V_FAN,
    V_PSTATE,
    V_MEMORY_TEMP,
    V_MEMORY_RESERVED,
    V_PCIE_TX,
    V_PCIE_RX,
    V_PCIE_REPLAY,
    V_PCIE_GEN,
    V_PCIE_WIDTH,
    V_RETIRED_SBE,
    V_RETIRED_DBE,
    V_RETIRED_PENDING,
    V_REMAP_CORR,
    V_REMAP_UNC,
    V_REMAP_PENDING,
    V_REMAP_FAILURE,
    V_POWER_VIOLATION,
    V_COUNT
};
static const char *const value_names[V_COUNT] = {
    "memory_total_bytes", "memory_used_bytes", "utilization_gpu", "utilization_memory",
    "power_usage_milliwatts", "temperature_celsius", "sm_clock_mhz", "memory_clock_mhz",
    "encoder_utilization", "decoder_utilization", "ecc_corrected", "ecc_uncorrected",
    "clocks_event_reasons",
    "energy_millijoules", "power_limit_milliwatts", "fan_speed_percent", "performance_state",
    "memory_temperature_celsius", "memory_reserved_bytes", "pcie_tx_kilobytes_per_second",
    "pcie_rx_kilobytes_per_second", "pcie_replay_count", "pcie_link_generation", "pcie_link_width",
    "retired_pages_single_bit", "retired_pages_double_bit", "retired_pages_pending",
    "remapped_rows_correctable", "remapped_rows_uncorrectable", "remapped_rows_pending",
    "remapped_rows_failure", "power_violation_nanoseconds",
};

/* An NVLink's values ("nvlink" line); an absent one answers NOT_SUPPORTED. */
enum nvlink_value { NL_ACTIVE, NL_TX_KIB, NL_RX_KIB, NL_CRC, NL_REPLAY, NL_RECOVERY, NL_COUNT };
struct nvlink {
    int present;
    int have[NL_COUNT];
    unsigned long long value[NL_COUNT];
};

/* The five GPM metrics of the scenario ("gpm_metric NAME RATIO"), by NVML_GPM_METRIC_* id. */
enum gpm_metric { G_GRAPHICS, G_SM, G_SM_OCCUPANCY, G_TENSOR, G_DRAM, G_COUNT };
static const struct {
    const char *key;
    unsigned int id;
} gpm_metrics[G_COUNT] = {
    {"graphics_active", 1}, /* NVML_GPM_METRIC_GRAPHICS_UTIL */
    {"sm_active", 2},       /* NVML_GPM_METRIC_SM_UTIL */
    {"sm_occupancy", 3},    /* NVML_GPM_METRIC_SM_OCCUPANCY */
    {"tensor_active", 5},   /* NVML_GPM_METRIC_ANY_TENSOR_UTIL */
    {"dram_active", 10},    /* NVML_GPM_METRIC_DRAM_BW_UTIL */
};

enum list_kind { L_COMPUTE, L_GRAPHICS, L_MPS, L_COUNT };
static const char *const kind_names[L_COUNT] = {"compute", "graphics", "mps"};

struct proc {
    unsigned int pid;
    unsigned long long used_memory; /* NVML_VALUE_NOT_AVAILABLE_ULL when not available */
    unsigned int sm_util;
    int kind;
};

struct xid {
    unsigned long long tick;
    unsigned long long xid;
};

struct fake_device {
    char uuid[96];
    char name[96];
    unsigned int minor;
    char pci_bus_id[32];
    int have[V_COUNT];
    unsigned long long value[V_COUNT];
    int not_supported[F_COUNT];
    int lost_after_set;
    unsigned long long lost_after_ticks;
    unsigned int process_growth;
    int growth_pending[L_COUNT];
    struct proc procs[MAX_PROCS];
    unsigned int nprocs;
    struct xid xids[MAX_XIDS];
    unsigned int nxids;
    unsigned long long tick;
    unsigned long long tick_us[UTIL_BUFFER_TICKS]; /* "timestamps wallclock": when tick t began */
    unsigned long long last_seen; /* lastSeenTimeStamp of the latest utilization call */
    unsigned long calls;
    /* MIG. A card in MIG mode has nmigs > 0 MIG devices in cfg.migs. A MIG device (is_mig) has
       only uuid, name, memory, processes and instance ids of its own; its tick, lost state and
       call count are its card's. */
    unsigned int nmigs;
    int is_mig;
    unsigned int parent; /* MIG device: index of its card in cfg.devices */
    unsigned int slot;   /* MIG device: its index for nvmlDeviceGetMigDeviceHandleByIndex */
    int have_gi, have_ci;
    unsigned int gi, ci; /* GPU instance id, compute instance id */
    unsigned long long probe_tick; /* MIG device: its card's tick after its latest utilization probe */
    /* health (issue 18), the card's own: a MIG device has only memory_reserved_bytes and the GPM
       ratios of its GPU instance (nvmlGpmMigSampleGet) */
    struct nvlink nvlinks[NVLINK_MAX_LINKS]; /* by link index */
    int have_gpm;                            /* a "gpm" line: GPM-capable (Hopper and newer) */
    int have_metric[G_COUNT];
    double gpm_ratio[G_COUNT];
};

/* An allocated GPM sample; nvmlGpmSampleGet records whose and when. */
struct fake_gpm_sample {
    int used;
    struct fake_device *device; /* NULL until nvmlGpmSampleGet fills it */
    unsigned long long tick;    /* the card's tick then */
    unsigned long long seq;     /* order of the nvmlGpmSampleGet calls: sample2 must be later */
};

struct fake_event_set {
    int used;
    unsigned long long types[MAX_DEVICES];     /* registered event types per device */
    unsigned int delivered[MAX_DEVICES];       /* xids of that device already handed out */
};

struct config {
    char driver_version[80];
    unsigned int init_failures;
    unsigned int init_delay_ms; /* nvmlInitWithFlags takes this long (a driver that hangs at init) */
    int old_driver;
    int manual_clock;
    int wallclock;       /* util sample timeStamps are CPU time (epoch us), as the driver's */
    int growth_every_tick; /* process_growth re-arms each tick, not only after init */
    int idle_after_set;
    unsigned long long idle_after_ticks; /* no utilization samples after this tick */
    unsigned int cuda_driver_version;
    unsigned int ndevices;
    struct fake_device devices[MAX_DEVICES];
    int in_mig; /* parsing: the keys that follow a "mig" line belong to that MIG device */
    unsigned int nmigs;
    struct fake_device migs[MAX_MIG_DEVICES];
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct config cfg;
static unsigned int refcount;
static struct fake_event_set event_sets[MAX_EVENT_SETS];
static struct fake_gpm_sample gpm_samples[MAX_GPM_SAMPLES]; /* cleared with the event sets */
static unsigned long long gpm_seq;
/* init_failures counts across attempts; restarted when the config (path or bytes) changes */
static uint64_t failure_key;
static unsigned int failures_served;

/* Per-function call counters, readable from tests through fakeNvmlCallCount. */
#define MAX_COUNTERS 160
static struct {
    const char *name;
    unsigned long count;
} counters[MAX_COUNTERS];

static void bump(const char *name) {
    for (int i = 0; i < MAX_COUNTERS; i++) {
        if (counters[i].name == NULL) {
            counters[i].name = name;
            counters[i].count = 1;
            return;
        }
        if (counters[i].name == name || strcmp(counters[i].name, name) == 0) {
            counters[i].count++;
            return;
        }
    }
}

#define ENTER()                  \
    pthread_mutex_lock(&lock);   \
    bump(__func__)
#define RETURN(rc)                 \
    do {                           \
        nvmlReturn_t rc_ = (rc);   \
        pthread_mutex_unlock(&lock); \
        return rc_;                \
    } while (0)

/* ---- config parsing ---- */

static uint64_t fnv1a(uint64_t h, const void *data, size_t len) {
    const unsigned char *p = data;
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= 1099511628211ULL;
    }
    return h;
}

static int parse_ull(const char *s, unsigned long long *out) {
    char *end;
    if (*s == '\0' || *s == '-')
        return -1;
    unsigned long long v = strtoull(s, &end, 0);
    if (*end != '\0')
        return -1;
    *out = v;
    return 0;
}

static int parse_uint(const char *s, unsigned int *out) {
    unsigned long long v;
    if (parse_ull(s, &v) != 0 || v > 0xFFFFFFFFULL)
        return -1;
    *out = (unsigned int)v;
    return 0;
}

static int copy_str(char *dst, size_t size, const char *src) {
    if (strlen(src) >= size)
        return -1;
    strcpy(dst, src);
    return 0;
}

/* nvlink LINK ACTIVE TX_KIB RX_KIB CRC REPLAY RECOVERY, each value a number or NA (absent) */
static int parse_nvlink(struct fake_device *d, char *rest) {
    char *tok[1 + NL_COUNT];
    int n = 0;
    for (char *save = NULL, *t = strtok_r(rest, " ", &save); t; t = strtok_r(NULL, " ", &save)) {
        if (n == 1 + NL_COUNT)
            return -1;
        tok[n++] = t;
    }
    unsigned int link;
    if (n != 1 + NL_COUNT || parse_uint(tok[0], &link) != 0 || link >= NVLINK_MAX_LINKS)
        return -1;
    struct nvlink *l = &d->nvlinks[link];
    if (l->present)
        return -1; /* one line per link */
    l->present = 1;
    for (int v = 0; v < NL_COUNT; v++) {
        if (strcmp(tok[1 + v], "NA") == 0)
            continue;
        if (parse_ull(tok[1 + v], &l->value[v]) != 0 || (v == NL_ACTIVE && l->value[v] > 1))
            return -1;
        l->have[v] = 1;
    }
    return 0;
}

/* gpm_metric NAME RATIO, RATIO in 0..1 */
static int parse_gpm_metric(struct fake_device *d, char *rest) {
    char *sp = strchr(rest, ' ');
    if (!d->have_gpm || sp == NULL)
        return -1;
    *sp = '\0';
    char *end;
    double ratio = strtod(sp + 1, &end);
    if (*end != '\0' || end == sp + 1 || !(ratio >= 0.0 && ratio <= 1.0))
        return -1;
    for (int g = 0; g < G_COUNT; g++) {
        if (strcmp(rest, gpm_metrics[g].key) == 0) {
            d->have_metric[g] = 1;
            d->gpm_ratio[g] = ratio;
            return 0;
        }
    }
    return -1;
}

/* One "key value" line; returns 0 or -1 for a malformed line. */
static int parse_line(struct config *c, char *key, char *rest) {
    struct fake_device *card = c->ndevices ? &c->devices[c->ndevices - 1] : NULL;
    struct fake_device *d = c->in_mig ? &c->migs[c->nmigs - 1] : card;

    if (strcmp(key, "fake_nvml_config") == 0)
        return strcmp(rest, "1") == 0 ? 0 : -1;
    if (strcmp(key, "driver_version") == 0)
        return copy_str(c->driver_version, sizeof c->driver_version, rest);
    if (strcmp(key, "init_failures") == 0)
        return parse_uint(rest, &c->init_failures);
    if (strcmp(key, "init_delay_ms") == 0)
        return parse_uint(rest, &c->init_delay_ms);
    if (strcmp(key, "old_driver") == 0) {
        unsigned int v;
        if (parse_uint(rest, &v) != 0 || v > 1)
            return -1;
        c->old_driver = (int)v;
        return 0;
    }
    if (strcmp(key, "cuda_driver_version") == 0)
        return parse_uint(rest, &c->cuda_driver_version);
    if (strcmp(key, "timestamps") == 0) {
        if (strcmp(rest, "ticks") == 0)
            c->wallclock = 0;
        else if (strcmp(rest, "wallclock") == 0)
            c->wallclock = 1;
        else
            return -1;
        return 0;
    }
    if (strcmp(key, "idle_after_ticks") == 0) {
        c->idle_after_set = 1;
        return parse_ull(rest, &c->idle_after_ticks);
    }
    if (strcmp(key, "growth_every_tick") == 0) {
        unsigned int v;
        if (parse_uint(rest, &v) != 0 || v > 1)
            return -1;
        c->growth_every_tick = (int)v;
        return 0;
    }
    if (strcmp(key, "clock") == 0) {
        if (strcmp(rest, "auto") == 0)
            c->manual_clock = 0;
        else if (strcmp(rest, "manual") == 0)
            c->manual_clock = 1;
        else
            return -1;
        return 0;
    }
    if (strcmp(key, "device") == 0) {
        if (c->ndevices >= MAX_DEVICES)
            return -1;
        c->ndevices++;
        c->in_mig = 0;
        return 0;
    }
    if (strcmp(key, "mig") == 0) {
        /* a MIG device of the current card; slot 0 stays empty, so enumeration meets a gap */
        if (card == NULL || *rest != '\0' || c->nmigs >= MAX_MIG_DEVICES)
            return -1;
        struct fake_device *m = &c->migs[c->nmigs++];
        m->is_mig = 1;
        m->parent = c->ndevices - 1;
        m->slot = ++card->nmigs;
        c->in_mig = 1;
        return 0;
    }
    if (d == NULL)
        return -1; /* every other key belongs to a device */
    if (d->is_mig && strcmp(key, "uuid") != 0 && strcmp(key, "name") != 0 &&
        strcmp(key, "memory_total_bytes") != 0 && strcmp(key, "memory_used_bytes") != 0 &&
        strcmp(key, "memory_reserved_bytes") != 0 && strcmp(key, "gpu_instance_id") != 0 && strcmp(key, "compute_instance_id") != 0 &&
        strcmp(key, "process") != 0 && strcmp(key, "gpm") != 0 && strcmp(key, "gpm_metric") != 0)
        return -1; /* the rest of a MIG device's values are its card's; gpm is its GPU instance's */
    if (strcmp(key, "gpu_instance_id") == 0 || strcmp(key, "compute_instance_id") == 0) {
        if (!d->is_mig)
            return -1;
        int gi = key[0] == 'g';
        *(gi ? &d->have_gi : &d->have_ci) = 1;
        return parse_uint(rest, gi ? &d->gi : &d->ci);
    }
    if (strcmp(key, "uuid") == 0)
        return copy_str(d->uuid, sizeof d->uuid, rest);
    if (strcmp(key, "name") == 0)
        return copy_str(d->name, sizeof d->name, rest);
    if (strcmp(key, "minor_number") == 0)
        return parse_uint(rest, &d->minor);
    if (strcmp(key, "pci_bus_id") == 0)
        return copy_str(d->pci_bus_id, sizeof d->pci_bus_id, rest);
    if (strcmp(key, "lost_after_ticks") == 0) {
        d->lost_after_set = 1;
        return parse_ull(rest, &d->lost_after_ticks);
    }
    if (strcmp(key, "process_growth") == 0)
        return parse_uint(rest, &d->process_growth);
    if (strcmp(key, "not_supported") == 0) {
        for (int f = 0; f < F_COUNT; f++) {
            if (strcmp(rest, field_names[f]) == 0) {
                d->not_supported[f] = 1;
                return 0;
            }
        }
        return -1;
    }
    if (strcmp(key, "xid") == 0) {
        unsigned long long tick, xid;
        char *sp = strchr(rest, ' ');
        if (sp == NULL || d->nxids >= MAX_XIDS)
            return -1;
        *sp = '\0';
        if (parse_ull(rest, &tick) != 0 || parse_ull(sp + 1, &xid) != 0)
            return -1;
        d->xids[d->nxids].tick = tick;
        d->xids[d->nxids].xid = xid;
        d->nxids++;
        return 0;
    }
    if (strcmp(key, "nvlink") == 0)
        return parse_nvlink(d, rest);
    if (strcmp(key, "gpm") == 0) {
        if (*rest != '\0')
            return -1;
        d->have_gpm = 1;
        return 0;
    }
    if (strcmp(key, "gpm_metric") == 0)
        return parse_gpm_metric(d, rest);
    if (strcmp(key, "process") == 0) {
        /* process PID MEMORY|NA SM_UTIL KIND */
        char *tok[4];
        int n = 0;
        for (char *save = NULL, *t = strtok_r(rest, " ", &save); t; t = strtok_r(NULL, " ", &save)) {
            if (n == 4)
                return -1;
            tok[n++] = t;
        }
        if (n != 4 || d->nprocs >= MAX_PROCS)
            return -1;
        struct proc *p = &d->procs[d->nprocs];
        if (parse_uint(tok[0], &p->pid) != 0 || parse_uint(tok[2], &p->sm_util) != 0)
            return -1;
        if (strcmp(tok[1], "NA") == 0)
            p->used_memory = NVML_VALUE_NOT_AVAILABLE_ULL;
        else if (parse_ull(tok[1], &p->used_memory) != 0)
            return -1;
        p->kind = -1;
        for (int k = 0; k < L_COUNT; k++)
            if (strcmp(tok[3], kind_names[k]) == 0)
                p->kind = k;
        if (p->kind < 0)
            return -1;
        d->nprocs++;
        return 0;
    }
    for (int v = 0; v < V_COUNT; v++) {
        if (strcmp(key, value_names[v]) == 0) {
            d->have[v] = 1;
            if (v == V_MEMORY_USED && strcmp(rest, "NA") == 0) {
                d->value[v] = NVML_VALUE_NOT_AVAILABLE_ULL;
                return 0;
            }
            return parse_ull(rest, &d->value[v]);
        }
    }
    return -1;
}

/* Reads $FAKE_NVML_CONFIG into *c; returns 0 or an NVML error (message on stderr). */
static nvmlReturn_t load_config(struct config *c, uint64_t *key) {
    const char *path = getenv("FAKE_NVML_CONFIG");
    if (path == NULL || *path == '\0') {
        fprintf(stderr, "fake_nvml: FAKE_NVML_CONFIG is not set; behaving as if no driver is loaded\n");
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        fprintf(stderr, "fake_nvml: cannot open FAKE_NVML_CONFIG=%s\n", path);
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    memset(c, 0, sizeof *c);
    strcpy(c->driver_version, "550.54.15");
    c->cuda_driver_version = DEFAULT_CUDA_DRIVER_VERSION;
    uint64_t h = fnv1a(14695981039346656037ULL, path, strlen(path) + 1);
    char line[1024];
    int lineno = 0;
    nvmlReturn_t rc = NVML_SUCCESS;
    while (fgets(line, sizeof line, f) != NULL) {
        lineno++;
        h = fnv1a(h, line, strlen(line));
        size_t len = strlen(line);
        if (len == sizeof line - 1 && line[len - 1] != '\n') {
            fprintf(stderr, "fake_nvml: %s:%d: line too long\n", path, lineno);
            rc = NVML_ERROR_UNKNOWN;
            break;
        }
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            line[--len] = '\0';
        if (len == 0 || line[0] == '#')
            continue;
        char *rest = strchr(line, ' ');
        if (rest != NULL)
            *rest++ = '\0';
        else
            rest = line + len; /* empty value */
        if (parse_line(c, line, rest) != 0) {
            fprintf(stderr, "fake_nvml: %s:%d: cannot parse '%s %s'\n", path, lineno, line, rest);
            rc = NVML_ERROR_UNKNOWN;
            break;
        }
    }
    fclose(f);
    *key = h;
    return rc;
}

/* ---- helpers ---- */

static int initialized(void) { return refcount > 0; }

/* A card's handle or a MIG device's handle; NULL for anything else. */
static struct fake_device *lookup(nvmlDevice_t h) {
    uintptr_t p = (uintptr_t)h, base = (uintptr_t)cfg.devices;
    if (p >= base && p < base + cfg.ndevices * sizeof cfg.devices[0] && (p - base) % sizeof cfg.devices[0] == 0)
        return h;
    base = (uintptr_t)cfg.migs;
    if (p >= base && p < base + cfg.nmigs * sizeof cfg.migs[0] && (p - base) % sizeof cfg.migs[0] == 0)
        return h;
    return NULL;
}

/* The physical GPU: the device itself, or a MIG device's card. */
static struct fake_device *card_of(struct fake_device *d) {
    return d->is_mig ? &cfg.devices[d->parent] : d;
}

/* A card in MIG mode (a MIG device is not a card: 0). */
static int mig_mode(const struct fake_device *d) { return !d->is_mig && d->nmigs > 0; }

/* nvmlDeviceGetMaxMigDeviceCount of a card in MIG mode */
static unsigned int mig_slots(const struct fake_device *card) {
    return card->nmigs + 1 > MIG_SLOTS ? card->nmigs + 1 : MIG_SLOTS;
}

static int is_lost(const struct fake_device *d) {
    return d->lost_after_set && d->tick > d->lost_after_ticks;
}

static unsigned long long now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (unsigned long long)ts.tv_sec * 1000000ULL + (unsigned long long)ts.tv_nsec / 1000ULL;
}

/* A new sampling period of the device: stamp it (strictly after the previous one, like the
   driver's CPU timestamps) and, with growth_every_tick, let processes appear again. */
static void start_tick(struct fake_device *d) {
    unsigned long long prev = d->tick_us[d->tick % UTIL_BUFFER_TICKS];
    unsigned long long now = now_us();
    d->tick++;
    d->tick_us[d->tick % UTIL_BUFFER_TICKS] = now > prev ? now : prev + 1;
    if (cfg.growth_every_tick)
        for (int k = 0; k < L_COUNT; k++)
            d->growth_pending[k] = d->process_growth > 0;
}

/* The common prologue of a call on a device handle. */
static nvmlReturn_t device_check(nvmlDevice_t h, struct fake_device **out) {
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    struct fake_device *d = lookup(h);
    if (d == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct fake_device *card = card_of(d); /* a MIG device falls off the bus with its card */
    card->calls++;
    if (is_lost(card))
        return NVML_ERROR_GPU_IS_LOST;
    *out = d;
    return NVML_SUCCESS;
}

#define DEVICE_PROLOGUE(h, d)                      \
    struct fake_device *d = NULL;                  \
    ENTER();                                       \
    {                                              \
        nvmlReturn_t pre_ = device_check((h), &d); \
        if (pre_ != NVML_SUCCESS)                  \
            RETURN(pre_);                          \
    }

static nvmlReturn_t copy_out(char *dst, unsigned int length, const char *src) {
    if (dst == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(dst, src);
    return NVML_SUCCESS;
}

/* ---- init, errors, system ---- */

EXPORT const char *nvmlErrorString(nvmlReturn_t result) {
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
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt Request Issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM: return "The operating system has blocked the request.";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    ENTER();
    if (initialized()) {
        refcount++; /* NVML is reference counted; only the first init loads state */
        RETURN(NVML_SUCCESS);
    }
    static struct config fresh; /* too big for the stack of a ctypes caller thread */
    uint64_t key = 0;
    nvmlReturn_t rc = load_config(&fresh, &key);
    if (rc != NVML_SUCCESS)
        RETURN(rc);
    if (key != failure_key) {
        failure_key = key;
        failures_served = 0;
    }
    if (fresh.init_delay_ms) { /* held under the lock, as a driver stuck in init holds its callers */
        struct timespec hang = {fresh.init_delay_ms / 1000, (long)(fresh.init_delay_ms % 1000) * 1000000L};
        nanosleep(&hang, NULL);
    }
    if (failures_served < fresh.init_failures) {
        failures_served++;
        RETURN(NVML_ERROR_DRIVER_NOT_LOADED);
    }
    cfg = fresh;
    for (unsigned int i = 0; i < cfg.ndevices; i++)
        for (int k = 0; k < L_COUNT; k++)
            cfg.devices[i].growth_pending[k] = cfg.devices[i].process_growth > 0;
    memset(event_sets, 0, sizeof event_sets);
    memset(gpm_samples, 0, sizeof gpm_samples);
    refcount = 1;
    RETURN(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
EXPORT nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

EXPORT nvmlReturn_t nvmlShutdown(void) {
    ENTER();
    if (!initialized())
        RETURN(NVML_ERROR_UNINITIALIZED);
    if (--refcount == 0) {
        memset(event_sets, 0, sizeof event_sets);
        memset(gpm_samples, 0, sizeof gpm_samples); /* samples die with NVML */
    }
    RETURN(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    ENTER();
    if (!initialized())
        RETURN(NVML_ERROR_UNINITIALIZED);
    RETURN(copy_out(version, length, cfg.driver_version));
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version) {
    ENTER();
    if (!initialized())
        RETURN(NVML_ERROR_UNINITIALIZED);
    if (version == NULL)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *version = (int)cfg.cuda_driver_version;
    RETURN(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version) {
    return nvmlSystemGetCudaDriverVersion(version);
}

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    ENTER();
    if (!initialized())
        RETURN(NVML_ERROR_UNINITIALIZED);
    if (count == NULL)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *count = cfg.ndevices;
    RETURN(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    ENTER();
    if (!initialized())
        RETURN(NVML_ERROR_UNINITIALIZED);
    if (device == NULL || index >= cfg.ndevices)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    struct fake_device *d = &cfg.devices[index];
    d->calls++;
    if (is_lost(d))
        RETURN(NVML_ERROR_GPU_IS_LOST);
    *device = d;
    RETURN(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

/* ---- identity ---- */

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t h, char *uuid, unsigned int length) {
    DEVICE_PROLOGUE(h, d);
    RETURN(copy_out(uuid, length, d->uuid));
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t h, char *name, unsigned int length) {
    DEVICE_PROLOGUE(h, d);
    RETURN(copy_out(name, length, d->name));
}

EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t h, unsigned int *minor) {
    DEVICE_PROLOGUE(h, d);
    if (minor == NULL)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (d->is_mig)
        RETURN(NVML_ERROR_NOT_SUPPORTED); /* the fake answers it on the card only */
    *minor = d->minor;
    RETURN(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t h, unsigned int *index) {
    DEVICE_PROLOGUE(h, d);
    if (index == NULL)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    /* a MIG device's index is the one nvmlDeviceGetMigDeviceHandleByIndex takes */
    *index = d->is_mig ? d->slot : (unsigned int)(d - cfg.devices);
    RETURN(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t h, nvmlPciInfo_t *pci) {
    DEVICE_PROLOGUE(h, d);
    if (pci == NULL)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (d->is_mig)
        RETURN(NVML_ERROR_NOT_SUPPORTED); /* the fake answers it on the card only */
    memset(pci, 0, sizeof *pci);
    unsigned int domain = 0, bus = 0, dev = 0, fn = 0;
    /* "DDDDDDDD:BB:DD.F"; an id in another shape is passed through with zero numbers */
    if (sscanf(d->pci_bus_id, "%x:%x:%x.%x", &domain, &bus, &dev, &fn) == 4) {
        pci->domain = domain;
        pci->bus = bus;
        pci->device = dev;
        snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.%X",
                 domain & 0xFFFFu, bus & 0xFFu, dev & 0xFFu, fn & 0xFu);
    }
    pci->pciDeviceId = 0x20B010DEu; /* any NVIDIA device id; the exporter does not read it */
    snprintf(pci->busId, sizeof pci->busId, "%s", d->pci_bus_id);
    RETURN(NVML_SUCCESS);
}

/* ---- device values ---- */

/* NOT_SUPPORTED when the field is listed in not_supported or a value it needs is absent. */
static int unsupported(const struct fake_device *d, enum field f, int value_a, int value_b) {
    if (d->not_supported[f])
        return 1;
    int a = value_a >= 0 && d->have[value_a];
    int b = value_b >= 0 && d->have[value_b];
    return !(a || b);
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t h, nvmlMemory_t *memory) {
    DEVICE_PROLOGUE(h, d);
    if (memory == NULL)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (mig_mode(d))
        RETURN(NVML_ERROR_NO_PERMISSION); /* the aggregate needs privileges; MIG handles have their own */
    if (d->not_supported[F_MEMORY] || !d->have[V_MEMORY_TOTAL])
        RETURN(NVML_ERROR_NOT_SUPPORTED);
    unsigned long long total = d->value[V_MEMORY_TOTAL];
    /* memory_used_bytes absent or null: NVML_VALUE_NOT_AVAILABLE, as is free then */
    unsigned long long used = d->have[V_MEMORY_USED] ? d->value[V_MEMORY_USED] : NVML_VALUE_NOT_AVAILABLE_ULL;
    memory->total = total;
    memory->used = used;
    memory->free = used == NVML_VALUE_NOT_AVAILABLE_ULL ? NVML_VALUE_NOT_AVAILABLE_ULL
                   : used > total                      ? 0
                                                       : total - used;
    RETURN(NVML_SUCCESS);
}

#ifndef OLD_DRIVER
/* Drivers >= 515. "reserved" is memory_reserved_bytes (0 when absent); v2's "used" leaves it out
   where v1's includes it, so v1 used = v2 used + reserved and "free" is the same in both.
   "not_supported memory_reserved_bytes": v2 NOT_SUPPORTED, v1 still answers. */
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t h, nvmlMemory_v2_t *memory) {
    DEVICE_PROLOGUE(h, d);
    if (cfg.old_driver)
        RETURN(NVML_ERROR_FUNCTION_NOT_FOUND); /* a normal build given "old_driver 1" */
    if (memory == NULL)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (memory->version != NVML_MEMORY_V2)
        RETURN(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    if (mig_mode(d))
        RETURN(NVML_ERROR_NO_PERMISSION);
    if (d->not_supported[F_MEMORY] || d->not_supported[F_MEMORY_RESERVED] || !d->have[V_MEMORY_TOTAL])
        RETURN(NVML_ERROR_NOT_SUPPORTED);
    unsigned long long total = d->value[V_MEMORY_TOTAL];
    unsigned long long used = d->have[V_MEMORY_USED] ? d->value[V_MEMORY_USED] : NVML_VALUE_NOT_AVAILABLE_ULL;
    unsigned long long reserved = d->have[V_MEMORY_RESERVED] ? d->value[V_MEMORY_RESERVED] : 0;
    memory->total = total;
    memory->reserved = reserved;
    memory->used = used == NVML_VALUE_NOT_AVAILABLE_ULL ? used : used > reserved ? used - reserved : 0;
    memory->free = used == NVML_VALUE_NOT_AVAILABLE_ULL ? NVML_VALUE_NOT_AVAILABLE_ULL
                   : used > total                      ? 0
                                                       : total - used;
    RETURN(NVML_SUCCESS);
}
#endif

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t h, nvmlUtilization_t *util) {
    DEVICE_PROLOGUE(h, d);
    if (util == NULL)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    /* "On MIG-enabled GPUs, querying device utilization rates is not currently supported" */
    if (mig_mode(card_of(d)) || unsupported(d, F_UTILIZATION, V_UTIL_GPU, V_UTIL_MEMORY))
        RETURN(NVML_ERROR_NOT_SUPPORTED);
    util->gpu = (unsigned int)d->value[V_UTIL_GPU]; /* an absent half reads 0 */
    util->memory = (unsigned int)d->value[V_UTIL_MEMORY];
    RETURN(NVML_SUCCESS);
}

#define UINT_GETTER(fn, field, v)                                   \
    EXPORT nvmlReturn_t fn(nvmlDevice_t h, unsigned int *out) {     \
        DEVICE_PROLOGUE(h, d);                                      \
        if (out == NULL)                                            \
            RETURN(NVML_ERROR_INVALID_ARGUMENT);                    \
        if (unsupported(d, field, v, -1))                           \
            RETURN(NVML_ERROR_NOT_SUPPORTED);                       \
        *out = (unsigned int)d->value[v];                           \
        RETURN(NVML_SUCCESS);                                       \
    }

UINT_GETTER(nvmlDeviceGetPowerUsage, F_POWER, V_POWER)

EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t h, int sensor, unsigned int *temp) {
    DEVICE_PROLOGUE(h, d);
    if (temp == NULL || sensor != 0 /* NVML_TEMPERATURE_GPU */)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (unsupported(d, F_TEMPERATURE, V_TEMPERATURE, -1))
        RETURN(NVML_ERROR_NOT_SUPPORTED);
    *temp = (unsigned int)d->value[V_TEMPERATURE];
    RETURN(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t h, int type, unsigned int *clock) {
    DEVICE_PROLOGUE(h, d);
    if (clock == NULL || type < 0 || type > 3)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    /* NVML_CLOCK_GRAPHICS(0) and SM(1) read the SM clock, MEM(2) the memory clock */
    int v = type == 2 ? V_MEMORY_CLOCK : type == 3 ? -1 : V_SM_CLOCK;
    if (v < 0 || unsupported(d, F_CLOCKS, v, -1))
        RETURN(NVML_ERROR_NOT_SUPPORTED);
    *clock = (unsigned int)d->value[v];
    RETURN(NVML_SUCCESS);
}

static nvmlReturn_t codec(nvmlDevice_t h, enum field f, enum value v, unsigned int *util,
                          unsigned int *period) {
    struct fake_device *d = NULL;
    nvmlReturn_t rc = device_check(h, &d);
    if (rc != NVML_SUCCESS)
        return rc;
    if (util == NULL || period == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    /* encoder and decoder utilization: not supported on MIG-enabled GPUs either */
    if (mig_mode(card_of(d)) || unsupported(d, f, v, -1))
        return NVML_ERROR_NOT_SUPPORTED;
    *util = (unsigned int)d->value[v];
    *period = CODEC_PERIOD_US;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetEncoderUtilization(nvmlDevice_t h, unsigned int *util, unsigned int *period) {
    ENTER();
    RETURN(codec(h, F_ENCODER, V_ENCODER, util, period));
}

EXPORT nvmlReturn_t nvmlDeviceGetDecoderUtilization(nvmlDevice_t h, unsigned int *util, unsigned int *period) {
    ENTER();
    RETURN(codec(h, F_DECODER, V_DECODER, util, period));
}

EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t h, int errorType, int counterType,
                                                unsigned long long *count) {
    DEVICE_PROLOGUE(h, d);
    /* errorType 0 corrected / 1 uncorrected; counterType 0 volatile / 1 aggregate read alike */
    if (count == NULL || errorType < 0 || errorType > 1 || counterType < 0 || counterType > 1)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    int v = errorType == 0 ? V_ECC_CORRECTED : V_ECC_UNCORRECTED;
    if (unsupported(d, F_ECC, v, -1))
        RETURN(NVML_ERROR_NOT_SUPPORTED);
    *count = d->value[v];
    RETURN(NVML_SUCCESS);
}

static nvmlReturn_t reasons(nvmlDevice_t h, unsigned long long *out) {
    struct fake_device *d = NULL;
    nvmlReturn_t rc = device_check(h, &d);
    if (rc != NVML_SUCCESS)
        return rc;
    if (out == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (unsupported(d, F_CLOCKS_EVENT_REASONS, V_CLOCKS_EVENT_REASONS, -1))
        return NVML_ERROR_NOT_SUPPORTED;
    *out = d->value[V_CLOCKS_EVENT_REASONS];
    return NVML_SUCCESS;
}

#ifndef OLD_DRIVER
EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t h, unsigned long long *out) {
    ENTER();
    if (cfg.old_driver && initialized())
        RETURN(NVML_ERROR_FUNCTION_NOT_FOUND);
    RETURN(reasons(h, out));
}
#endif

/* The pre-530 name of the same call; still exported by current drivers. */
EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t h, unsigned long long *out) {
    ENTER();
    RETURN(reasons(h, out));
}

/* ---- running processes ---- */

static int in_list(const struct proc *p, int list) {
    /* MPS clients are listed by the compute call too (nvidia-smi shows them as "M+C") */
    return p->kind == list || (list == L_COMPUTE && p->kind == L_MPS);
}

static nvmlReturn_t running_processes(nvmlDevice_t h, int list, unsigned int *count,
                                      nvmlProcessInfo_t *infos) {
    struct fake_device *d = NULL;
    nvmlReturn_t rc = device_check(h, &d);
    if (rc != NVML_SUCCESS)
        return rc;
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    /* in MIG mode the card's list is the aggregate, for privileged callers only: the fake's caller
       is not; each MIG handle lists its own processes */
    if (mig_mode(d))
        return NVML_ERROR_NO_PERMISSION;
    unsigned int n = 0;
    for (unsigned int i = 0; i < d->nprocs; i++)
        n += in_list(&d->procs[i], list);
    unsigned int visible = n;
    if (d->growth_pending[list]) {
        /* process_growth: the first call after init (with growth_every_tick: in each tick)
           sees K fewer processes, as if K started between the size probe and the fetch */
        d->growth_pending[list] = 0;
        visible = n > d->process_growth ? n - d->process_growth : 0;
    }
    if (visible == 0) {
        *count = 0;
        return NVML_SUCCESS;
    }
    if (infos == NULL || *count < visible) {
        *count = visible;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    unsigned int j = 0;
    for (unsigned int i = 0; i < d->nprocs && j < visible; i++) {
        const struct proc *p = &d->procs[i];
        if (!in_list(p, list))
            continue;
        infos[j].pid = p->pid;
        infos[j].usedGpuMemory = p->used_memory;
        infos[j].gpuInstanceId = d->is_mig && d->have_gi ? d->gi : NVML_NO_INSTANCE;
        infos[j].computeInstanceId = d->is_mig && d->have_ci ? d->ci : NVML_NO_INSTANCE;
        j++;
    }
    *count = j;
    return NVML_SUCCESS;
}

#define PROCESS_CALL(fn, list)                                                          \
    EXPORT nvmlReturn_t fn(nvmlDevice_t h, unsigned int *count, nvmlProcessInfo_t *infos) { \
        ENTER();                                                                        \
        RETURN(running_processes(h, list, count, infos));                               \
    }
/* A normal build with "old_driver 1" answers FUNCTION_NOT_FOUND from the _v3 calls. */
#define PROCESS_CALL_V3(fn, list)                                                       \
    EXPORT nvmlReturn_t fn(nvmlDevice_t h, unsigned int *count, nvmlProcessInfo_t *infos) { \
        ENTER();                                                                        \
        if (cfg.old_driver && initialized())                                            \
            RETURN(NVML_ERROR_FUNCTION_NOT_FOUND);                                      \
        RETURN(running_processes(h, list, count, infos));                               \
    }

PROCESS_CALL(nvmlDeviceGetComputeRunningProcesses_v2, L_COMPUTE)
PROCESS_CALL(nvmlDeviceGetGraphicsRunningProcesses_v2, L_GRAPHICS)
PROCESS_CALL(nvmlDeviceGetMPSComputeRunningProcesses_v2, L_MPS)
#ifndef OLD_DRIVER
PROCESS_CALL_V3(nvmlDeviceGetComputeRunningProcesses_v3, L_COMPUTE)
PROCESS_CALL_V3(nvmlDeviceGetGraphicsRunningProcesses_v3, L_GRAPHICS)
PROCESS_CALL_V3(nvmlDeviceGetMPSComputeRunningProcesses_v3, L_MPS)
#endif

/* ---- MIG ---- */

/* Current and pending mode alike: enabled for a card with MIG devices, disabled for the others
   (MIG-capable boards with MIG off); NOT_SUPPORTED on a board without MIG ("not_supported mig"). */
EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t h, unsigned int *currentMode, unsigned int *pendingMode) {
    DEVICE_PROLOGUE(h, d);
    if (currentMode == NULL || pendingMode == NULL)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (d->is_mig || d->not_supported[F_MIG])
        RETURN(NVML_ERROR_NOT_SUPPORTED);
    *currentMode = mig_mode(d) ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE;
    *pendingMode = *currentMode;
    RETURN(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t h, unsigned int *isMigDevice) {
    DEVICE_PROLOGUE(h, d);
    if (isMigDevice == NULL)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *isMigDevice = d->is_mig ? 1u : 0u;
    RETURN(NVML_SUCCESS);
}

/* 0 when MIG is off or not supported, as nvml.h says. */
EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t h, unsigned int *count) {
    DEVICE_PROLOGUE(h, d);
    if (count == NULL || d->is_mig)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *count = mig_mode(d) ? mig_slots(d) : 0u;
    RETURN(NVML_SUCCESS);
}

/* NOT_FOUND for an empty slot (slot 0 always is; the MIG devices follow in scenario order). */
EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t h, unsigned int index, nvmlDevice_t *migDevice) {
    DEVICE_PROLOGUE(h, d);
    if (migDevice == NULL || d->is_mig)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (!mig_mode(d))
        RETURN(NVML_ERROR_NOT_SUPPORTED);
    if (index >= mig_slots(d))
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    unsigned int card = (unsigned int)(d - cfg.devices);
    for (unsigned int i = 0; i < cfg.nmigs; i++) {
        if (cfg.migs[i].parent == card && cfg.migs[i].slot == index) {
            *migDevice = &cfg.migs[i];
            RETURN(NVML_SUCCESS);
        }
    }
    RETURN(NVML_ERROR_NOT_FOUND);
}

EXPORT nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice, nvmlDevice_t *device) {
    DEVICE_PROLOGUE(migDevice, d);
    if (device == NULL || !d->is_mig)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *device = card_of(d);
    RETURN(NVML_SUCCESS);
}

/* Instance ids of a MIG device; NOT_SUPPORTED on a card or when the scenario gives none. */
EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t h, unsigned int *id) {
    DEVICE_PROLOGUE(h, d);
    if (id == NULL)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (!d->is_mig || !d->have_gi)
        RETURN(NVML_ERROR_NOT_SUPPORTED);
    *id = d->gi;
    RETURN(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t h, unsigned int *id) {
    DEVICE_PROLOGUE(h, d);
    if (id == NULL)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (!d->is_mig || !d->have_ci)
        RETURN(NVML_ERROR_NOT_SUPPORTED);
    *id = d->ci;
    RETURN(NVML_SUCCESS);
}

/* ---- health (issue 18): energy, power limit, fan, P-state, PCIe, retired pages, row remapping,
   NVLink, field values, GPM ----

   Values come from the scenario keys of the same name (docs/testing.md); an absent key or its
   name in not_supported answers NOT_SUPPORTED, after the usual checks (uninitialised, invalid
   handle, lost GPU) and the NULL-pointer check. These are the card's signals: on a MIG handle
   every call here answers NOT_SUPPORTED (nvmlDeviceGetFieldValues per field), as for power and
   temperature; a consumer reads them on the card. */

/* The prologue of a card-level call with one output pointer. */
#define CARD_PROLOGUE(h, d, out)                 \
    DEVICE_PROLOGUE(h, d);                       \
    if ((out) == NULL)                           \
        RETURN(NVML_ERROR_INVALID_ARGUMENT);     \
    if (d->is_mig)                               \
        RETURN(NVML_ERROR_NOT_SUPPORTED)

#define HEALTH_UINT(fn, field, v)                               \
    EXPORT nvmlReturn_t fn(nvmlDevice_t h, unsigned int *out) { \
        CARD_PROLOGUE(h, d, out);                               \
        if (unsupported(d, field, v, -1))                       \
            RETURN(NVML_ERROR_NOT_SUPPORTED);                   \
        *out = (unsigned int)d->value[v];                       \
        RETURN(NVML_SUCCESS);                                   \
    }

/* The fake has one limit: the enforced one and the power-management one are the same. */
HEALTH_UINT(nvmlDeviceGetEnforcedPowerLimit, F_POWER_LIMIT, V_POWER_LIMIT)
HEALTH_UINT(nvmlDeviceGetPowerManagementLimit, F_POWER_LIMIT, V_POWER_LIMIT)
HEALTH_UINT(nvmlDeviceGetFanSpeed, F_FAN, V_FAN)
HEALTH_UINT(nvmlDeviceGetPcieReplayCounter, F_PCIE_REPLAY, V_PCIE_REPLAY)
HEALTH_UINT(nvmlDeviceGetCurrPcieLinkGeneration, F_PCIE_GEN, V_PCIE_GEN)
HEALTH_UINT(nvmlDeviceGetCurrPcieLinkWidth, F_PCIE_WIDTH, V_PCIE_WIDTH)

/* mJ since driver load: energy_millijoules at tick 0, then power_usage_milliwatts per tick (one
   tick = 1 s, mW x s = mJ), so rate() of it is the configured power. Without a power reading
   (absent, or "not_supported power") it stands still, as in the simulated node. */
EXPORT nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t h, unsigned long long *energy) {
    CARD_PROLOGUE(h, d, energy);
    if (unsupported(d, F_ENERGY, V_ENERGY, -1))
        RETURN(NVML_ERROR_NOT_SUPPORTED);
    unsigned long long power = d->have[V_POWER] && !d->not_supported[F_POWER] ? d->value[V_POWER] : 0;
    *energy = d->value[V_ENERGY] + power * d->tick;
    RETURN(NVML_SUCCESS);
}

/* nvmlViolationTime_t: ns the clocks were held down by a policy since driver load (reference time: us). */
typedef struct {
    unsigned long long referenceTime;
    unsigned long long violationTime;
} nvmlViolationTime_t;

/* Policy NVML_PERF_POLICY_POWER (0): power_violation_nanoseconds, standing still; the other policies
   (thermal, sync boost, ...) NOT_SUPPORTED, an unknown one INVALID_ARGUMENT. */
EXPORT nvmlReturn_t nvmlDeviceGetViolationStatus(nvmlDevice_t h, int policy, nvmlViolationTime_t *out) {
    CARD_PROLOGUE(h, d, out);
    if (policy < 0 || policy > 11)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (policy != 0 || unsupported(d, F_POWER_VIOLATION, V_POWER_VIOLATION, -1))
        RETURN(NVML_ERROR_NOT_SUPPORTED);
    out->referenceTime = d->tick * TICK_US;
    out->violationTime = d->value[V_POWER_VIOLATION];
    RETURN(NVML_SUCCESS);
}

/* The card has one fan (index 0); another index is INVALID_ARGUMENT, as past nvmlDeviceGetNumFans. */
EXPORT nvmlReturn_t nvmlDeviceGetFanSpeed_v2(nvmlDevice_t h, unsigned int fan, unsigned int *speed) {
    CARD_PROLOGUE(h, d, speed);
    if (fan != 0)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (unsupported(d, F_FAN, V_FAN, -1))
        RETURN(NVML_ERROR_NOT_SUPPORTED);
    *speed = (unsigned int)d->value[V_FAN];
    RETURN(NVML_SUCCESS);
}

/* nvmlPstates_t: 0 (P0) .. 15; the fake never answers NVML_PSTATE_UNKNOWN (32). */
EXPORT nvmlReturn_t nvmlDeviceGetPerformanceState(nvmlDevice_t h, int *pState) {
    CARD_PROLOGUE(h, d, pState);
    if (unsupported(d, F_PSTATE, V_PSTATE, -1))
        RETURN(NVML_ERROR_NOT_SUPPORTED);
    *pState = (int)d->value[V_PSTATE];
    RETURN(NVML_SUCCESS);
}

/* KB/s: counter NVML_PCIE_UTIL_TX_BYTES (0) or NVML_PCIE_UTIL_RX_BYTES (1). */
EXPORT nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t h, int counter, unsigned int *value) {
    CARD_PROLOGUE(h, d, value);
    if (counter < 0 || counter > 1)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    int f = counter == 0 ? F_PCIE_TX : F_PCIE_RX, v = counter == 0 ? V_PCIE_TX : V_PCIE_RX;
    if (unsupported(d, f, v, -1))
        RETURN(NVML_ERROR_NOT_SUPPORTED);
    *value = (unsigned int)d->value[v];
    RETURN(NVML_SUCCESS);
}

/* Retired pages of one cause (0: multiple single-bit ECC errors, 1: a double-bit ECC error), with
   the size probe of nvml.h: *count 0 (or too small) answers INSUFFICIENT_SIZE and the count
   needed, SUCCESS and 0 when none is retired. Page i of cause c has the (made-up, distinct)
   address (c + 1) << 32 | i << 12 and the timestamp 1700000000 + i (seconds). */
static nvmlReturn_t retired_pages(nvmlDevice_t h, int cause, unsigned int *count, unsigned long long *addresses,
                                  unsigned long long *timestamps, int want_timestamps) {
    struct fake_device *d = NULL;
    nvmlReturn_t rc = device_check(h, &d);
    if (rc != NVML_SUCCESS)
        return rc;
    if (count == NULL || cause < 0 || cause > 1)
        return NVML_ERROR_INVALID_ARGUMENT;
    int f = cause == 0 ? F_RETIRED_SBE : F_RETIRED_DBE, v = cause == 0 ? V_RETIRED_SBE : V_RETIRED_DBE;
    if (d->is_mig || unsupported(d, f, v, -1))
        return NVML_ERROR_NOT_SUPPORTED;
    unsigned int n = (unsigned int)d->value[v];
    if (n == 0) {
        *count = 0;
        return NVML_SUCCESS;
    }
    if (*count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    if (addresses == NULL || (want_timestamps && timestamps == NULL))
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < n; i++) {
        addresses[i] = ((unsigned long long)cause + 1) << 32 | (unsigned long long)i << 12;
        if (want_timestamps)
            timestamps[i] = 1700000000ULL + i;
    }
    *count = n;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t h, int cause, unsigned int *pageCount,
                                              unsigned long long *addresses) {
    ENTER();
    RETURN(retired_pages(h, cause, pageCount, addresses, NULL, 0));
}

EXPORT nvmlReturn_t nvmlDeviceGetRetiredPages_v2(nvmlDevice_t h, int cause, unsigned int *pageCount,
                                                 unsigned long long *addresses, unsigned long long *timestamps) {
    ENTER();
    RETURN(retired_pages(h, cause, pageCount, addresses, timestamps, 1));
}

/* nvmlEnableState_t: NVML_FEATURE_ENABLED (1) when pages wait for the next reset to retire. */
EXPORT nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t h, unsigned int *isPending) {
    CARD_PROLOGUE(h, d, isPending);
    if (unsupported(d, F_RETIRED_PENDING, V_RETIRED_PENDING, -1))
        RETURN(NVML_ERROR_NOT_SUPPORTED);
    *isPending = d->value[V_RETIRED_PENDING] ? 1u : 0u;
    RETURN(NVML_SUCCESS);
}

/* One call for four values: NOT_SUPPORTED when none of the four keys is given or any of their
   names is in not_supported (NVML cannot blank one of them); an absent one of four reads 0. */
EXPORT nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t h, unsigned int *corrRows, unsigned int *uncRows,
                                              unsigned int *isPending, unsigned int *failureOccurred) {
    DEVICE_PROLOGUE(h, d);
    if (corrRows == NULL || uncRows == NULL || isPending == NULL || failureOccurred == NULL)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (d->is_mig)
        RETURN(NVML_ERROR_NOT_SUPPORTED);
    int any = 0;
    for (int k = 0; k < 4; k++) { /* the four are consecutive, in the same order, in both enums */
        if (d->not_supported[F_REMAP_CORR + k])
            RETURN(NVML_ERROR_NOT_SUPPORTED);
        any |= d->have[V_REMAP_CORR + k];
    }
    if (!any)
        RETURN(NVML_ERROR_NOT_SUPPORTED);
    *corrRows = (unsigned int)d->value[V_REMAP_CORR];
    *uncRows = (unsigned int)d->value[V_REMAP_UNC];
    *isPending = d->value[V_REMAP_PENDING] ? 1u : 0u;
    *failureOccurred = d->value[V_REMAP_FAILURE] ? 1u : 0u;
    RETURN(NVML_SUCCESS);
}

/* An NVLink value: INVALID_ARGUMENT for a link past NVML_NVLINK_MAX_LINKS, NOT_SUPPORTED for a
   link the scenario does not list (as on a GPU with fewer links, or none), for an absent value,
   and under "not_supported nvlinks". */
static nvmlReturn_t nvlink_value(const struct fake_device *d, unsigned int link, int v, unsigned long long *out) {
    if (link >= NVLINK_MAX_LINKS)
        return NVML_ERROR_INVALID_ARGUMENT;
    const struct nvlink *l = &d->nvlinks[link];
    if (d->is_mig || d->not_supported[F_NVLINKS] || !l->present || !l->have[v])
        return NVML_ERROR_NOT_SUPPORTED;
    *out = l->value[v];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t h, unsigned int link, unsigned int *isActive) {
    DEVICE_PROLOGUE(h, d);
    if (isActive == NULL)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    unsigned long long v = 0;
    nvmlReturn_t rc = nvlink_value(d, link, NL_ACTIVE, &v);
    if (rc == NVML_SUCCESS)
        *isActive = v ? 1u : 0u; /* NVML_FEATURE_ENABLED / _DISABLED */
    RETURN(rc);
}

/* counter NVML_NVLINK_ERROR_DL_REPLAY (0), _DL_RECOVERY (1), _DL_CRC_FLIT (2); the scenario has no
   _DL_CRC_DATA (3) and _DL_ECC_DATA (4): NOT_SUPPORTED; others INVALID_ARGUMENT. */
EXPORT nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t h, unsigned int link, int counter,
                                                    unsigned long long *counterValue) {
    DEVICE_PROLOGUE(h, d);
    if (counterValue == NULL || counter < 0 || counter > 4)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    static const int value_of[3] = {NL_REPLAY, NL_RECOVERY, NL_CRC};
    unsigned long long v = 0;
    nvmlReturn_t rc = nvlink_value(d, link, counter <= 2 ? value_of[counter] : NL_CRC, &v);
    if (rc == NVML_SUCCESS && counter > 2)
        rc = NVML_ERROR_NOT_SUPPORTED;
    if (rc == NVML_SUCCESS)
        *counterValue = v;
    RETURN(rc);
}

#define NVML_FI_DEV_MEMORY_TEMP 82
#define NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX 138 /* KiB since driver load, scopeId = link */
#define NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX 139
#define NVML_VALUE_TYPE_UNSIGNED_INT 1
#define NVML_VALUE_TYPE_UNSIGNED_LONG_LONG 3

/* One field's status and value; fields the fake has no value for are NOT_SUPPORTED. */
static void field_value(const struct fake_device *d, nvmlFieldValue_t *fv) {
    unsigned long long v = 0;
    memset(&fv->value, 0, sizeof fv->value);
    switch (fv->fieldId) {
    case NVML_FI_DEV_MEMORY_TEMP:
        fv->nvmlReturn = d->is_mig || unsupported(d, F_MEMORY_TEMP, V_MEMORY_TEMP, -1) ? NVML_ERROR_NOT_SUPPORTED
                                                                                      : NVML_SUCCESS;
        fv->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
        fv->value.uiVal = fv->nvmlReturn == NVML_SUCCESS ? (unsigned int)d->value[V_MEMORY_TEMP] : 0u;
        return;
    case NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX:
    case NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX:
        fv->nvmlReturn = nvlink_value(d, fv->scopeId,
                                      fv->fieldId == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX ? NL_TX_KIB : NL_RX_KIB, &v);
        fv->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
        fv->value.ullVal = v;
        return;
    default:
        fv->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
    }
}

/* The call succeeds and each requested field carries its own status. */
EXPORT nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t h, int valuesCount, nvmlFieldValue_t *values) {
    DEVICE_PROLOGUE(h, d);
    if (values == NULL || valuesCount < 0)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    long long stamp = (long long)now_us();
    for (int i = 0; i < valuesCount; i++) {
        values[i].timestamp = stamp;
        values[i].latencyUsec = 0;
        field_value(d, &values[i]);
    }
    RETURN(NVML_SUCCESS);
}

/* GPM (R520+, Hopper and newer): a device with the scenario key "gpm" supports it. Samples come
   from a fixed pool; nvmlGpmMetricsGet needs two samples of one card, sample2 taken after sample1
   (INVALID_ARGUMENT otherwise), and answers each metric NVML_GPM_METRIC_* in percent: ratio x 100
   for the five of the scenario, NOT_SUPPORTED for a metric it leaves out and any other one. */
#ifndef OLD_DRIVER

static char gpm_unit[] = "%";
static char gpm_short[G_COUNT][16] = {"gr_util", "sm_util", "sm_occupancy", "any_tensor_util", "dram_bw_util"};

static struct fake_gpm_sample *lookup_sample(nvmlGpmSample_t s) {
    uintptr_t p = (uintptr_t)s, base = (uintptr_t)gpm_samples;
    if (p < base || p >= base + sizeof gpm_samples || (p - base) % sizeof gpm_samples[0] || !s->used)
        return NULL;
    return s;
}

static int gpm_capable(const struct fake_device *d) { return !d->is_mig && d->have_gpm && !d->not_supported[F_GPM]; }

/* The checks every GPM call starts with: uninitialised, and a normal build told "old_driver 1". */
static nvmlReturn_t gpm_check(void) {
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    return cfg.old_driver ? NVML_ERROR_FUNCTION_NOT_FOUND : NVML_SUCCESS;
}

/* The MIG device of a card's GPU instance gi that carries its GPM ratios; NULL when there is none. */
static struct fake_device *gpu_instance(const struct fake_device *card, unsigned int gi) {
    unsigned int index = (unsigned int)(card - cfg.devices);
    for (unsigned int i = 0; i < cfg.nmigs; i++) {
        struct fake_device *m = &cfg.migs[i];
        if (m->parent == index && m->have_gi && m->gi == gi)
            return m;
    }
    return NULL;
}

/* isSupportedDevice 0 on a device without GPM (before Hopper); NOT_SUPPORTED on a MIG handle. */
EXPORT nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t h, nvmlGpmSupport_t *gpmSupport) {
    DEVICE_PROLOGUE(h, d);
    if (cfg.old_driver)
        RETURN(NVML_ERROR_FUNCTION_NOT_FOUND);
    if (gpmSupport == NULL)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (gpmSupport->version != NVML_GPM_SUPPORT_VERSION)
        RETURN(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    if (d->is_mig)
        RETURN(NVML_ERROR_NOT_SUPPORTED);
    gpmSupport->isSupportedDevice = gpm_capable(d) ? 1u : 0u;
    RETURN(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *gpmSample) {
    ENTER();
    nvmlReturn_t rc = gpm_check();
    if (rc != NVML_SUCCESS)
        RETURN(rc);
    if (gpmSample == NULL)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    for (int i = 0; i < MAX_GPM_SAMPLES; i++) {
        if (!gpm_samples[i].used) {
            memset(&gpm_samples[i], 0, sizeof gpm_samples[i]);
            gpm_samples[i].used = 1;
            *gpmSample = &gpm_samples[i];
            RETURN(NVML_SUCCESS);
        }
    }
    RETURN(NVML_ERROR_MEMORY); /* a consumer that never frees its samples runs out here */
}

EXPORT nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t gpmSample) {
    ENTER();
    nvmlReturn_t rc = gpm_check();
    if (rc != NVML_SUCCESS)
        RETURN(rc);
    struct fake_gpm_sample *s = lookup_sample(gpmSample);
    if (s == NULL)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    s->used = 0;
    RETURN(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t h, nvmlGpmSample_t gpmSample) {
    DEVICE_PROLOGUE(h, d);
    if (cfg.old_driver)
        RETURN(NVML_ERROR_FUNCTION_NOT_FOUND);
    struct fake_gpm_sample *s = lookup_sample(gpmSample);
    if (s == NULL)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (!gpm_capable(d))
        RETURN(NVML_ERROR_NOT_SUPPORTED);
    s->device = d;
    s->tick = d->tick;
    s->seq = ++gpm_seq;
    RETURN(NVML_SUCCESS);
}

/* A GPU instance's sample, on its card's handle (nvml.h: "for a MIG GPU Instance", Hopper and newer):
   NOT_SUPPORTED on a card without GPM, INVALID_ARGUMENT for a MIG handle or a GPU instance id none of
   the card's MIG devices has (MIG off included). The sample records the instance's MIG device. */
EXPORT nvmlReturn_t nvmlGpmMigSampleGet(nvmlDevice_t h, unsigned int gpuInstanceId, nvmlGpmSample_t gpmSample) {
    DEVICE_PROLOGUE(h, d);
    if (cfg.old_driver)
        RETURN(NVML_ERROR_FUNCTION_NOT_FOUND);
    struct fake_gpm_sample *s = lookup_sample(gpmSample);
    if (s == NULL || d->is_mig)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (!gpm_capable(d))
        RETURN(NVML_ERROR_NOT_SUPPORTED);
    struct fake_device *m = gpu_instance(d, gpuInstanceId);
    if (m == NULL)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    s->device = m;
    s->tick = d->tick;
    s->seq = ++gpm_seq;
    RETURN(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *metricsGet) {
    ENTER();
    nvmlReturn_t rc = gpm_check();
    if (rc != NVML_SUCCESS)
        RETURN(rc);
    if (metricsGet == NULL)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (metricsGet->version != NVML_GPM_METRICS_GET_VERSION)
        RETURN(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    struct fake_gpm_sample *s1 = lookup_sample(metricsGet->sample1), *s2 = lookup_sample(metricsGet->sample2);
    if (metricsGet->numMetrics > NVML_GPM_METRIC_MAX || s1 == NULL || s2 == NULL || s1->device == NULL ||
        s1->device != s2->device || s2->seq <= s1->seq)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    struct fake_device *d = s1->device; /* a card, or the MIG device of a GPU instance */
    card_of(d)->calls++;
    if (is_lost(card_of(d)))
        RETURN(NVML_ERROR_GPU_IS_LOST);
    for (unsigned int i = 0; i < metricsGet->numMetrics; i++) {
        nvmlGpmMetric_t *m = &metricsGet->metrics[i];
        m->nvmlReturn = m->metricId == 0 || m->metricId >= NVML_GPM_METRIC_MAX ? NVML_ERROR_INVALID_ARGUMENT
                                                                              : NVML_ERROR_NOT_SUPPORTED;
        m->value = 0.0;
        memset(&m->metricInfo, 0, sizeof m->metricInfo);
        for (int g = 0; g < G_COUNT; g++) {
            if (m->metricId == gpm_metrics[g].id && d->have_metric[g]) {
                m->nvmlReturn = NVML_SUCCESS;
                m->value = d->gpm_ratio[g] * 100.0;
                m->metricInfo.shortName = gpm_short[g];
                m->metricInfo.longName = gpm_short[g];
                m->metricInfo.unit = gpm_unit;
            }
        }
    }
    RETURN(NVML_SUCCESS);
}

#endif /* OLD_DRIVER */

/* ---- process utilization ---- */

/* Samples newer than last_seen in the device's buffer; writes up to cap into out. */
static unsigned int util_samples(const struct fake_device *d, unsigned long long last_seen,
                                 nvmlProcessUtilizationSample_t *out, unsigned int cap) {
    unsigned int n = 0;
    unsigned long long first = d->tick >= UTIL_BUFFER_TICKS ? d->tick - UTIL_BUFFER_TICKS + 1 : 1;
    /* idle_after_ticks: the processes stop computing (and keep their memory) after that tick */
    unsigned long long last = cfg.idle_after_set && cfg.idle_after_ticks < d->tick ? cfg.idle_after_ticks : d->tick;
    for (unsigned long long t = first; t <= last; t++) {
        unsigned long long ts = cfg.wallclock ? d->tick_us[t % UTIL_BUFFER_TICKS] : t * TICK_US;
        if (ts <= last_seen)
            continue;
        for (unsigned int i = 0; i < d->nprocs; i++) {
            const struct proc *p = &d->procs[i];
            if (p->sm_util == 0)
                continue; /* the driver reports only processes that did something */
            if (out != NULL && n < cap) {
                memset(&out[n], 0, sizeof out[n]);
                out[n].pid = p->pid;
                out[n].timeStamp = ts;
                out[n].smUtil = p->sm_util;
            }
            n++;
        }
    }
    return n;
}

EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t h, nvmlProcessUtilizationSample_t *utilization,
                                                    unsigned int *processSamplesCount,
                                                    unsigned long long lastSeenTimeStamp) {
    ENTER();
    struct fake_device *d = lookup(h);
    /* clock auto: the size probe (NULL buffer) starts a new sampling period, before
       anything else is decided; pynvml makes exactly one probe per call. A card in MIG mode
       has one period per round of probes on its MIG devices: the first MIG device probed
       again (since the card's tick last moved) starts it. */
    if (initialized() && d != NULL && utilization == NULL && !cfg.manual_clock) {
        if (!d->is_mig) {
            start_tick(d);
        } else {
            struct fake_device *card = card_of(d);
            if (d->probe_tick >= card->tick)
                start_tick(card);
            d->probe_tick = card->tick;
        }
    }
    nvmlReturn_t rc = device_check(h, &d);
    if (rc != NVML_SUCCESS)
        RETURN(rc);
    if (processSamplesCount == NULL)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    /* "On MIG-enabled GPUs, querying process utilization is not currently supported" */
    if (d->is_mig || mig_mode(d) || d->not_supported[F_PROCESS_UTILIZATION])
        RETURN(NVML_ERROR_NOT_SUPPORTED);
    d->last_seen = lastSeenTimeStamp;
    unsigned int n = util_samples(d, lastSeenTimeStamp, NULL, 0);
    if (n == 0)
        RETURN(NVML_ERROR_NOT_FOUND);
    if (utilization == NULL || *processSamplesCount < n) {
        *processSamplesCount = n;
        RETURN(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    *processSamplesCount = util_samples(d, lastSeenTimeStamp, utilization, n);
    RETURN(NVML_SUCCESS);
}

/* ---- events (Xid) ---- */

static struct fake_event_set *lookup_set(nvmlEventSet_t s) {
    uintptr_t p = (uintptr_t)s, base = (uintptr_t)event_sets;
    if (p < base || p >= base + sizeof event_sets || (p - base) % sizeof event_sets[0] || !s->used)
        return NULL;
    return s;
}

EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    ENTER();
    if (!initialized())
        RETURN(NVML_ERROR_UNINITIALIZED);
    if (set == NULL)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    for (int i = 0; i < MAX_EVENT_SETS; i++) {
        if (!event_sets[i].used) {
            memset(&event_sets[i], 0, sizeof event_sets[i]);
            event_sets[i].used = 1;
            *set = &event_sets[i];
            RETURN(NVML_SUCCESS);
        }
    }
    RETURN(NVML_ERROR_MEMORY);
}

/* Events are a card's: a MIG handle gets NOT_SUPPORTED. "not_supported events": no Xid events. */
EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t h, unsigned long long *types) {
    DEVICE_PROLOGUE(h, d);
    if (types == NULL)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (d->is_mig)
        RETURN(NVML_ERROR_NOT_SUPPORTED);
    *types = d->not_supported[F_EVENTS] ? 0ULL : NVML_EVENT_TYPE_XID_CRITICAL_ERROR;
    RETURN(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t h, unsigned long long types, nvmlEventSet_t set) {
    DEVICE_PROLOGUE(h, d);
    struct fake_event_set *s = lookup_set(set);
    if (s == NULL)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (d->is_mig || d->not_supported[F_EVENTS] || (types & ~NVML_EVENT_TYPE_XID_CRITICAL_ERROR))
        RETURN(NVML_ERROR_NOT_SUPPORTED);
    unsigned int i = (unsigned int)(d - cfg.devices);
    s->types[i] |= types;
    /* only Xids at or after the registration tick are delivered to this set */
    unsigned int skip = 0;
    while (skip < d->nxids && d->xids[skip].tick < d->tick)
        skip++;
    if (s->delivered[i] < skip)
        s->delivered[i] = skip;
    RETURN(NVML_SUCCESS);
}

/* Hands out one due Xid of a registered device; returns 1 when one was written. */
static int next_event(struct fake_event_set *s, nvmlEventData_t *data) {
    for (unsigned int i = 0; i < cfg.ndevices; i++) {
        struct fake_device *d = &cfg.devices[i];
        if (!(s->types[i] & NVML_EVENT_TYPE_XID_CRITICAL_ERROR) || s->delivered[i] >= d->nxids)
            continue;
        const struct xid *x = &d->xids[s->delivered[i]];
        if (x->tick > d->tick)
            continue;
        s->delivered[i]++;
        data->device = d;
        data->eventType = NVML_EVENT_TYPE_XID_CRITICAL_ERROR;
        data->eventData = x->xid;
        data->gpuInstanceId = NVML_NO_INSTANCE;
        data->computeInstanceId = NVML_NO_INSTANCE;
        return 1;
    }
    return 0;
}

EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    struct timespec start, now, nap = {0, 1000000};
    clock_gettime(CLOCK_MONOTONIC, &start);
    pthread_mutex_lock(&lock);
    bump(__func__);
    for (;;) {
        if (!initialized())
            RETURN(NVML_ERROR_UNINITIALIZED);
        struct fake_event_set *s = lookup_set(set);
        if (s == NULL || data == NULL)
            RETURN(NVML_ERROR_INVALID_ARGUMENT);
        if (next_event(s, data))
            RETURN(NVML_SUCCESS);
        clock_gettime(CLOCK_MONOTONIC, &now);
        long long waited_ms = (now.tv_sec - start.tv_sec) * 1000LL + (now.tv_nsec - start.tv_nsec) / 1000000;
        if (waited_ms >= (long long)timeoutms)
            RETURN(NVML_ERROR_TIMEOUT);
        /* ticks move in other threads' calls: release the lock while napping */
        pthread_mutex_unlock(&lock);
        nanosleep(&nap, NULL);
        pthread_mutex_lock(&lock);
    }
}

EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    ENTER();
    if (!initialized())
        RETURN(NVML_ERROR_UNINITIALIZED);
    struct fake_event_set *s = lookup_set(set);
    if (s == NULL)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    s->used = 0;
    RETURN(NVML_SUCCESS);
}

/* ---- test hooks (not NVML API): tests/fake_nvml/__init__.py wraps them ---- */

/* Advances every device's tick by n (the only clock in "clock manual"). */
EXPORT void fakeNvmlAdvanceTicks(unsigned int n) {
    pthread_mutex_lock(&lock);
    for (unsigned int i = 0; i < cfg.ndevices; i++)
        for (unsigned int k = 0; k < n; k++)
            start_tick(&cfg.devices[i]);
    pthread_mutex_unlock(&lock);
}

EXPORT unsigned long long fakeNvmlGetTick(unsigned int index) {
    pthread_mutex_lock(&lock);
    unsigned long long t = index < cfg.ndevices ? cfg.devices[index].tick : 0;
    pthread_mutex_unlock(&lock);
    return t;
}

/* lastSeenTimeStamp passed by the latest nvmlDeviceGetProcessUtilization on the device. */
EXPORT unsigned long long fakeNvmlLastSeenTimeStamp(unsigned int index) {
    pthread_mutex_lock(&lock);
    unsigned long long t = index < cfg.ndevices ? cfg.devices[index].last_seen : 0;
    pthread_mutex_unlock(&lock);
    return t;
}

/* Calls of one exported NVML function since load or fakeNvmlReset, failed ones included. */
EXPORT unsigned long fakeNvmlCallCount(const char *name) {
    unsigned long n = 0;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_COUNTERS && counters[i].name != NULL; i++)
        if (strcmp(counters[i].name, name) == 0)
            n = counters[i].count;
    pthread_mutex_unlock(&lock);
    return n;
}

/* Calls that reached one device (its handle, or its index for GetHandleByIndex). */
EXPORT unsigned long fakeNvmlDeviceCallCount(unsigned int index) {
    pthread_mutex_lock(&lock);
    unsigned long n = index < cfg.ndevices ? cfg.devices[index].calls : 0;
    pthread_mutex_unlock(&lock);
    return n;
}

/* Forgets everything: NVML uninitialised, counters and the init-failure count cleared. */
EXPORT void fakeNvmlReset(void) {
    pthread_mutex_lock(&lock);
    refcount = 0;
    memset(&cfg, 0, sizeof cfg);
    memset(event_sets, 0, sizeof event_sets);
    memset(gpm_samples, 0, sizeof gpm_samples);
    gpm_seq = 0;
    memset(counters, 0, sizeof counters);
    failure_key = 0;
    failures_served = 0;
    pthread_mutex_unlock(&lock);
}
