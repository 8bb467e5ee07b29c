/*
 * A small, faithful stand-in for the NVIDIA driver's libnvidia-ml.so.1, compiled by the tests.
 *
 * Why: no GPU exists on CI machines, yet the probe's NVML path (load by absolute path in a
 * killable child, pynvml as the client, init that hangs or fails, MIG layouts, driver versions)
 * must be exercised for real. The exported symbols and signatures are NVML's own, so pynvml
 * (nvidia-ml-py) drives it exactly as it drives the real library, and eBPF uprobes on
 * nvmlInit_v2 see a real function in a real ELF.
 *
 * Behaviour comes from a config file: $FAKE_NVML_CONFIG, else "fake_nvml.conf" next to this
 * library (found with dladdr). Lines of key=value:
 *   init=ok | block | error:<nvmlReturn_t> | slow:<seconds>
 *     block: the init call waits on a real futex forever (like a hung driver call)
 *   init_log=<path>   each init call appends "<pid>\n" to it first (which process asked)
 *   driver_version=570.158.01      nvml_version=12.570.158.01     cuda_version=12080
 *   gpu=<uuid>|<name>|<minor>|<mig 0/1>|<ecc uncorrected>|<remap pending 0/1>|<remap failed 0/1>
 *   mig=<gpu index>|<uuid>|<name>|<gpu instance id>|<compute instance id>
 *   Optional trailing gpu= fields (empty = default), in this order:
 *     |<pci bus id, default 00000000:<minor+1 hex>:00.0>|<persistence 0/1, default 1>
 *     |<pending MIG mode 0/1, default = current>|<fabric state 0..3, default 0 = not supported>
 *     |<fabric status nvmlReturn_t, default 0>|<lost: 0, 1 = handle by index returns
 *      GPU_IS_LOST (15), 2 = handle works but memory/process queries return 15>
 *     |<memory used MiB, default 0>|<memory total MiB, default 97871>
 *     |<remapped rows for correctable errors, default 0>|<remapped rows for uncorrectable
 *      errors, default 1 when pending or failed, else 0>|<row remapper supported 0/1, default 1;
 *      0 = a pre-Ampere GPU: the remapper calls return NOT_SUPPORTED, as on V100/T4>
 *     |<remapper histogram "max,high,partial,low,none" (banks by rows still available),
 *      default: all banks at max>
 *   proc=<gpu index>|<pid>|<used GPU memory bytes>   (a running compute process)
 *   set=<gpu index>|<attribute>|<value>   what says whether a GPU runs slow (issue 38); each
 *     attribute has a healthy default (attr_names/attr_defaults below: the link at its max
 *     generation while the GPU is busy, at Gen1 while idle); the value "none"
 *     (or -1) makes its query return NOT_SUPPORTED, as on GPUs and drivers without it:
 *     pcie_gen_cur pcie_width_cur pcie_gen_max pcie_width_max pcie_gen_gpu_max
 *     util_gpu util_mem clock_reasons sm_mhz sm_max_mhz mem_mhz mem_max_mhz
 *     temp_c temp_slowdown_c temp_shutdown_c power_mw power_limit_mw power_default_mw
 *     nvlinks (how many links answer) nvlink_down (bitmask of inactive links)
 *     ecc_sbe ecc_dbe retired_pending
 *     clock_api: 0 both names, 1 only nvmlDeviceGetCurrentClocksThrottleReasons (a driver
 *       before 535: the EventReasons call is FUNCTION_NOT_FOUND)
 *   set=<gpu index>|nvlink_err|<link>,<counter 0 replay 1 recovery 2 crc flit 3 crc data>,<n>
 *   set=<gpu index>|nvlink_remote|<link>,<remote gpu index>   what the link connects to
 *     (nvmlDeviceGetNvLinkRemotePciInfo_v2 answers that GPU's bus id; a link without one
 *     answers NOT_SUPPORTED)
 *   set=<gpu index>|p2p|<other gpu index>,<nvmlGpuP2PCapsIndex_t>,<nvmlGpuP2PStatus_t>
 *     nvmlDeviceGetP2PStatus for that pair and capability (both orders); default 0 (OK)
 *   set=<gpu index>|virt_mode|<nvmlGpuVirtualizationMode_t>  0 bare metal (default),
 *     1 pass-through, 2 vGPU guest; "none": NOT_SUPPORTED
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <linux/futex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

typedef int nvmlReturn_t;
#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_FUNCTION_NOT_FOUND 13
#define NVML_ERROR_GPU_IS_LOST 15

#define MAX_GPUS 16
#define MAX_MIG 8
#define MAX_PROCS 16
#define MAX_LINKS 18

enum { A_GEN_CUR, A_WIDTH_CUR, A_GEN_MAX, A_WIDTH_MAX, A_GEN_GPU_MAX, A_UTIL_GPU, A_UTIL_MEM,
       A_REASONS, A_SM, A_SM_MAX, A_MEM, A_MEM_MAX, A_TEMP, A_TEMP_SLOW, A_TEMP_SHUT,
       A_POWER, A_POWER_LIMIT, A_POWER_DEFAULT, A_NVLINKS, A_NVLINK_DOWN, A_SBE, A_DBE,
       A_RETIRED_PENDING, A_CLOCK_API, A_VIRT_MODE, NATTR };
static const char *attr_names[NATTR] = {
    "pcie_gen_cur", "pcie_width_cur", "pcie_gen_max", "pcie_width_max", "pcie_gen_gpu_max",
    "util_gpu", "util_mem", "clock_reasons", "sm_mhz", "sm_max_mhz", "mem_mhz", "mem_max_mhz",
    "temp_c", "temp_slowdown_c", "temp_shutdown_c", "power_mw", "power_limit_mw",
    "power_default_mw", "nvlinks", "nvlink_down", "ecc_sbe", "ecc_dbe", "retired_pending",
    "clock_api", "virt_mode"};
/* a healthy H100-like GPU: its link at Gen5 while busy (util_gpu > 0 or a proc= line) and
 * idled down to Gen1 otherwise, as real GPUs do (-2: that automatic value), clocks idle
 * (reason 0x1 GPU idle), 700 W default limit, no NVLink answered, no errors */
#define AUTO_GEN (-2)
static const long long attr_defaults[NATTR] = {
    AUTO_GEN, 16, 5, 16, 5, 0, 0, 0x1, 345, 1980, 2619, 2619, 34, 87, 92, 70000, 700000, 700000,
    0, 0, 0, 0, 0, 0, 0};

struct fake_dev {
    int is_mig;
    int index;
    char uuid[96];
    char name[96];
    int minor;
    int mig_mode;
    unsigned long long ecc_uncorrected;
    int remap_pending, remap_failed;
    int gi, ci;
    int parent;
    char pci_bus_id[32];
    int persistence;
    int mig_pending;
    int fabric_state, fabric_status;
    int lost;
    unsigned long long mem_used_mib, mem_total_mib;
    unsigned int remap_corr, remap_unc;
    int remap_supported;
    unsigned int hist[5];
    int nprocs;
    unsigned int proc_pid[MAX_PROCS];
    unsigned long long proc_mem[MAX_PROCS];
    int nmig;
    struct fake_dev *migs[MAX_MIG];
    long long attr[NATTR];
    unsigned long long nvlink_err[MAX_LINKS][4];
    int nvlink_remote[MAX_LINKS];          /* remote GPU index + 1; 0 = not answered */
    int p2p[MAX_GPUS][6];                  /* nvmlGpuP2PStatus_t per peer and caps index */
};

static struct fake_dev gpus[MAX_GPUS];
static struct fake_dev migs[MAX_GPUS * MAX_MIG];
static int ngpus, nmigs_total;
static char init_mode[64] = "ok";
static char init_log[1024];
static char driver_version[80] = "550.54.15";
static char nvml_version[80] = "12.550.54.15";
static int cuda_version = 12040;
static int loaded, initialized;
static volatile int futex_word;

static void trim(char *s) {
    size_t n = strlen(s);
    while (n && (s[n - 1] == '\n' || s[n - 1] == '\r' || s[n - 1] == ' ')) s[--n] = 0;
}

static void split(char *s, char **out, int max) {
    int i = 0;
    out[i++] = s;
    for (char *p = s; *p && i < max; p++)
        if (*p == '|') { *p = 0; out[i++] = p + 1; }
    while (i < max) out[i++] = "";
}

static void load_config(void) {
    if (loaded) return;
    loaded = 1;
    char path[4096];
    const char *env = getenv("FAKE_NVML_CONFIG");
    if (env && *env) {
        snprintf(path, sizeof path, "%s", env);
    } else {
        Dl_info info;
        if (!dladdr((void *)load_config, &info) || !info.dli_fname) return;
        snprintf(path, sizeof path, "%s", info.dli_fname);
        char *slash = strrchr(path, '/');
        if (!slash) return;
        snprintf(slash + 1, sizeof path - (slash + 1 - path), "fake_nvml.conf");
    }
    FILE *f = fopen(path, "r");
    if (!f) return;
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        trim(line);
        char *eq = strchr(line, '=');
        if (!eq || line[0] == '#') continue;
        *eq = 0;
        char *k = line, *v = eq + 1;
        if (!strcmp(k, "init")) snprintf(init_mode, sizeof init_mode, "%s", v);
        else if (!strcmp(k, "init_log")) snprintf(init_log, sizeof init_log, "%s", v);
        else if (!strcmp(k, "driver_version")) snprintf(driver_version, sizeof driver_version, "%s", v);
        else if (!strcmp(k, "nvml_version")) snprintf(nvml_version, sizeof nvml_version, "%s", v);
        else if (!strcmp(k, "cuda_version")) cuda_version = atoi(v);
        else if (!strcmp(k, "gpu") && ngpus < MAX_GPUS) {
            char *fl[19];
            split(v, fl, 19);
            struct fake_dev *g = &gpus[ngpus];
            memset(g, 0, sizeof *g);
            g->index = ngpus;
            snprintf(g->uuid, sizeof g->uuid, "%s", fl[0]);
            snprintf(g->name, sizeof g->name, "%s", fl[1]);
            g->minor = atoi(fl[2]);
            g->mig_mode = atoi(fl[3]);
            g->ecc_uncorrected = strtoull(fl[4], NULL, 10);
            g->remap_pending = atoi(fl[5]);
            g->remap_failed = atoi(fl[6]);
            if (*fl[7]) snprintf(g->pci_bus_id, sizeof g->pci_bus_id, "%s", fl[7]);
            else snprintf(g->pci_bus_id, sizeof g->pci_bus_id, "00000000:%02X:00.0", g->minor + 1);
            g->persistence = *fl[8] ? atoi(fl[8]) : 1;
            g->mig_pending = *fl[9] ? atoi(fl[9]) : g->mig_mode;
            g->fabric_state = atoi(fl[10]);
            g->fabric_status = atoi(fl[11]);
            g->lost = atoi(fl[12]);
            g->mem_used_mib = strtoull(fl[13], NULL, 10);
            g->mem_total_mib = *fl[14] ? strtoull(fl[14], NULL, 10) : 97871;
            g->remap_corr = (unsigned int)strtoul(fl[15], NULL, 10);
            g->remap_unc = *fl[16] ? (unsigned int)strtoul(fl[16], NULL, 10)
                                   : (g->remap_pending || g->remap_failed ? 1 : 0);
            g->remap_supported = *fl[17] ? atoi(fl[17]) : 1;
            if (*fl[18]) sscanf(fl[18], "%u,%u,%u,%u,%u", &g->hist[0], &g->hist[1],
                                &g->hist[2], &g->hist[3], &g->hist[4]);
            else g->hist[0] = 640;  /* every bank still has all its spare rows */
            memcpy(g->attr, attr_defaults, sizeof g->attr);
            ngpus++;
        } else if (!strcmp(k, "set")) {
            char *fl[3];
            split(v, fl, 3);
            int gi = atoi(fl[0]);
            if (gi < 0 || gi >= ngpus) continue;
            struct fake_dev *g = &gpus[gi];
            if (!strcmp(fl[1], "nvlink_err")) {
                unsigned int link = 0, counter = 0;
                unsigned long long n = 0;
                if (sscanf(fl[2], "%u,%u,%llu", &link, &counter, &n) == 3 && link < MAX_LINKS
                    && counter < 4)
                    g->nvlink_err[link][counter] = n;
                continue;
            }
            if (!strcmp(fl[1], "nvlink_remote")) {
                unsigned int link = 0;
                int peer = -1;
                if (sscanf(fl[2], "%u,%d", &link, &peer) == 2 && link < MAX_LINKS && peer >= 0
                    && peer < MAX_GPUS)
                    g->nvlink_remote[link] = peer + 1;
                continue;
            }
            if (!strcmp(fl[1], "p2p")) {
                int peer = -1, caps = -1, status = 0;
                if (sscanf(fl[2], "%d,%d,%d", &peer, &caps, &status) == 3 && peer >= 0
                    && peer < MAX_GPUS && caps >= 0 && caps < 6) {
                    g->p2p[peer][caps] = status;
                    gpus[peer].p2p[gi][caps] = status;
                }
                continue;
            }
            for (int a = 0; a < NATTR; a++)
                if (!strcmp(fl[1], attr_names[a]))
                    g->attr[a] = strcmp(fl[2], "none") ? strtoll(fl[2], NULL, 0) : -1;
        } else if (!strcmp(k, "proc")) {
            char *fl[3];
            split(v, fl, 3);
            int gi = atoi(fl[0]);
            if (gi < 0 || gi >= ngpus || gpus[gi].nprocs >= MAX_PROCS) continue;
            struct fake_dev *g = &gpus[gi];
            g->proc_pid[g->nprocs] = (unsigned int)strtoul(fl[1], NULL, 10);
            g->proc_mem[g->nprocs] = strtoull(fl[2], NULL, 10);
            g->nprocs++;
        } else if (!strcmp(k, "mig") && nmigs_total < MAX_GPUS * MAX_MIG) {
            char *fl[5];
            split(v, fl, 5);
            int parent = atoi(fl[0]);
            if (parent < 0 || parent >= ngpus || gpus[parent].nmig >= MAX_MIG) continue;
            struct fake_dev *m = &migs[nmigs_total++];
            memset(m, 0, sizeof *m);
            m->is_mig = 1;
            m->parent = parent;
            m->index = gpus[parent].nmig;
            snprintf(m->uuid, sizeof m->uuid, "%s", fl[1]);
            snprintf(m->name, sizeof m->name, "%s", fl[2]);
            m->gi = atoi(fl[3]);
            m->ci = atoi(fl[4]);
            m->minor = -1;
            gpus[parent].migs[gpus[parent].nmig++] = m;
        }
    }
    fclose(f);
}

static nvmlReturn_t do_init(void) {
    load_config();
    if (*init_log) {
        FILE *f = fopen(init_log, "a");
        if (f) { fprintf(f, "%d\n", (int)getpid()); fclose(f); }
    }
    if (!strcmp(init_mode, "block")) {
        /* A real futex wait that never ends: what a thread hung in the driver looks like from
         * user space (the thread sits in futex(FUTEX_WAIT) and never returns). */
        for (;;) syscall(SYS_futex, &futex_word, FUTEX_WAIT_PRIVATE, 0, NULL, NULL, 0);
    }
    if (!strncmp(init_mode, "error:", 6)) return atoi(init_mode + 6);
    if (!strncmp(init_mode, "slow:", 5)) {
        double s = atof(init_mode + 5);
        struct timespec ts = {(time_t)s, (long)((s - (time_t)s) * 1e9)};
        nanosleep(&ts, NULL);
    }
    initialized++;
    return NVML_SUCCESS;
}

/* Not static and not inlined: uprobes need real, distinct entry points. */
__attribute__((noinline)) nvmlReturn_t nvmlInit_v2(void) { return do_init(); }
__attribute__((noinline)) nvmlReturn_t nvmlInit(void) { return do_init(); }
__attribute__((noinline)) nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { (void)flags; return do_init(); }

nvmlReturn_t nvmlShutdown(void) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    initialized--;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 4: return "Insufficient Permissions";
    case 6: return "Not Found";
    case 9: return "Driver Not Loaded";
    case 10: return "Timeout";
    case 12: return "NVML Shared Library Not Found";
    case 15: return "GPU is lost";
    case 17: return "Operating System Error";
    case 18: return "Driver/library version mismatch";
    case 999: return "Unknown Error";
    default: return "Unknown Error";
    }
}

#define NEED_INIT() do { if (!initialized) return NVML_ERROR_UNINITIALIZED; } while (0)

static nvmlReturn_t copy_str(char *dst, unsigned int len, const char *src) {
    if (!dst) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > len) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(dst, src);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *v, unsigned int len) { NEED_INIT(); return copy_str(v, len, driver_version); }
nvmlReturn_t nvmlSystemGetNVMLVersion(char *v, unsigned int len) { NEED_INIT(); return copy_str(v, len, nvml_version); }
nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) { NEED_INIT(); *v = cuda_version; return NVML_SUCCESS; }
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { NEED_INIT(); *v = cuda_version; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) { NEED_INIT(); *n = ngpus; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetCount(unsigned int *n) { return nvmlDeviceGetCount_v2(n); }

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, struct fake_dev **h) {
    NEED_INIT();
    if (i >= (unsigned)ngpus || !h) return NVML_ERROR_INVALID_ARGUMENT;
    if (gpus[i].lost == 1) return NVML_ERROR_GPU_IS_LOST;
    *h = &gpus[i];
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int i, struct fake_dev **h) { return nvmlDeviceGetHandleByIndex_v2(i, h); }

nvmlReturn_t nvmlDeviceGetUUID(struct fake_dev *d, char *v, unsigned int len) { NEED_INIT(); return copy_str(v, len, d->uuid); }
nvmlReturn_t nvmlDeviceGetName(struct fake_dev *d, char *v, unsigned int len) { NEED_INIT(); return copy_str(v, len, d->name); }
nvmlReturn_t nvmlDeviceGetMinorNumber(struct fake_dev *d, unsigned int *m) {
    NEED_INIT();
    if (d->is_mig) return NVML_ERROR_NOT_SUPPORTED;
    *m = d->minor;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetMigMode(struct fake_dev *d, unsigned int *cur, unsigned int *pending) {
    NEED_INIT();
    if (d->is_mig) return NVML_ERROR_NOT_SUPPORTED;
    *cur = d->mig_mode;
    *pending = d->mig_pending;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceIsMigDeviceHandle(struct fake_dev *d, unsigned int *is) { NEED_INIT(); *is = d->is_mig; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(struct fake_dev *d, unsigned int *n) {
    NEED_INIT();
    if (!d->mig_mode) return NVML_ERROR_NOT_SUPPORTED;
    *n = MAX_MIG;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(struct fake_dev *d, unsigned int i, struct fake_dev **m) {
    NEED_INIT();
    if (!d->mig_mode) return NVML_ERROR_NOT_SUPPORTED;
    if (i >= MAX_MIG) return NVML_ERROR_INVALID_ARGUMENT;
    if (i >= (unsigned)d->nmig) return NVML_ERROR_NOT_FOUND;
    *m = d->migs[i];
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetGpuInstanceId(struct fake_dev *d, unsigned int *id) {
    NEED_INIT();
    if (!d->is_mig) return NVML_ERROR_NOT_SUPPORTED;
    *id = d->gi;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetComputeInstanceId(struct fake_dev *d, unsigned int *id) {
    NEED_INIT();
    if (!d->is_mig) return NVML_ERROR_NOT_SUPPORTED;
    *id = d->ci;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetEccMode(struct fake_dev *d, int *cur, int *pending) {
    NEED_INIT();
    if (d->is_mig) return NVML_ERROR_NOT_SUPPORTED;
    *cur = 1;
    *pending = 1;
    return NVML_SUCCESS;
}
/* counterType 0 = volatile, 1 = aggregate; errorType 0 = corrected, 1 = uncorrected */
nvmlReturn_t nvmlDeviceGetTotalEccErrors(struct fake_dev *d, int errorType, int counterType,
                                         unsigned long long *count) {
    NEED_INIT();
    (void)counterType;
    if (d->is_mig) return NVML_ERROR_NOT_SUPPORTED;
    if (errorType == 1) { *count = d->ecc_uncorrected; return NVML_SUCCESS; }
    if (d->attr[A_SBE] < 0) return NVML_ERROR_NOT_SUPPORTED;
    *count = (unsigned long long)d->attr[A_SBE];
    return NVML_SUCCESS;
}
/* nvml.h: nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows,
 * unsigned int *uncRows, unsigned int *isPending, unsigned int *failureOccurred);
 * NVML_ERROR_NOT_SUPPORTED on GPUs without a row remapper (before Ampere) and on MIG handles. */
nvmlReturn_t nvmlDeviceGetRemappedRows(struct fake_dev *d, unsigned int *corr, unsigned int *unc,
                                       unsigned int *pending, unsigned int *failure) {
    NEED_INIT();
    if (!corr || !unc || !pending || !failure) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->lost) return NVML_ERROR_GPU_IS_LOST;
    if (d->is_mig || !d->remap_supported) return NVML_ERROR_NOT_SUPPORTED;
    *corr = d->remap_corr;
    *unc = d->remap_unc;
    *pending = d->remap_pending;
    *failure = d->remap_failed;
    return NVML_SUCCESS;
}

/* nvmlRowRemapperHistogramValues_t as in nvml.h: banks with max/high/partial/low/none
 * spare rows left. */
typedef struct { unsigned int max, high, partial, low, none; } fake_remap_histogram;

nvmlReturn_t nvmlDeviceGetRowRemapperHistogram(struct fake_dev *d, fake_remap_histogram *h) {
    NEED_INIT();
    if (!h) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->lost) return NVML_ERROR_GPU_IS_LOST;
    if (d->is_mig || !d->remap_supported) return NVML_ERROR_NOT_SUPPORTED;
    h->max = d->hist[0]; h->high = d->hist[1]; h->partial = d->hist[2];
    h->low = d->hist[3]; h->none = d->hist[4];
    return NVML_SUCCESS;
}

/* PCI info (nvmlPciInfo_t as in nvml.h: legacy bus id[16], domain, bus, device, ids, bus id[32]) */
typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} fake_pci_info;

nvmlReturn_t nvmlDeviceGetPciInfo_v3(struct fake_dev *d, fake_pci_info *p) {
    NEED_INIT();
    if (!p) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->is_mig) d = &gpus[d->parent];
    memset(p, 0, sizeof *p);
    snprintf(p->busId, sizeof p->busId, "%s", d->pci_bus_id);
    snprintf(p->busIdLegacy, sizeof p->busIdLegacy, "%s", d->pci_bus_id + (strlen(d->pci_bus_id) > 12 ? 4 : 0));
    unsigned int dom = 0, bus = 0, dev = 0;
    sscanf(d->pci_bus_id, "%x:%x:%x", &dom, &bus, &dev);
    p->domain = dom; p->bus = bus; p->device = dev;
    p->pciDeviceId = 0x233010de;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetPciInfo_v2(struct fake_dev *d, fake_pci_info *p) { return nvmlDeviceGetPciInfo_v3(d, p); }
nvmlReturn_t nvmlDeviceGetPciInfo(struct fake_dev *d, fake_pci_info *p) { return nvmlDeviceGetPciInfo_v3(d, p); }

/* nvmlEnableState_t: 0 disabled, 1 enabled */
nvmlReturn_t nvmlDeviceGetPersistenceMode(struct fake_dev *d, int *mode) {
    NEED_INIT();
    if (d->is_mig) return NVML_ERROR_NOT_SUPPORTED;
    *mode = d->persistence;
    return NVML_SUCCESS;
}

/* nvmlGpuFabricInfo_t as in nvml.h (state is an unsigned char, nvmlGpuFabricState_t) */
typedef struct {
    unsigned char clusterUuid[16];
    nvmlReturn_t status;
    unsigned int cliqueId;
    unsigned char state;
} fake_fabric_info;

nvmlReturn_t nvmlDeviceGetGpuFabricInfo(struct fake_dev *d, fake_fabric_info *f) {
    NEED_INIT();
    if (!f) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->is_mig || d->fabric_state == 0) return NVML_ERROR_NOT_SUPPORTED;
    memset(f, 0, sizeof *f);
    f->state = (unsigned char)d->fabric_state;
    f->status = d->fabric_status;
    f->cliqueId = d->fabric_state == 3 ? 1 : 0;
    return NVML_SUCCESS;
}

typedef struct { unsigned long long total, free, used; } fake_memory;

nvmlReturn_t nvmlDeviceGetMemoryInfo(struct fake_dev *d, fake_memory *m) {
    NEED_INIT();
    if (!m) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->lost) return NVML_ERROR_GPU_IS_LOST;
    if (d->is_mig) return NVML_ERROR_NOT_SUPPORTED;
    m->total = d->mem_total_mib << 20;
    m->used = d->mem_used_mib << 20;
    m->free = m->total > m->used ? m->total - m->used : 0;
    return NVML_SUCCESS;
}

/* nvmlProcessInfo_t (v2/v3 layout): pid, usedGpuMemory, gpuInstanceId, computeInstanceId */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} fake_process_info;

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(struct fake_dev *d, unsigned int *count,
                                                     fake_process_info *infos) {
    NEED_INIT();
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->lost) return NVML_ERROR_GPU_IS_LOST;
    if (d->is_mig) return NVML_ERROR_NOT_SUPPORTED;
    if (*count < (unsigned)d->nprocs || (!infos && d->nprocs)) {
        *count = d->nprocs;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (int i = 0; i < d->nprocs; i++) {
        infos[i].pid = d->proc_pid[i];
        infos[i].usedGpuMemory = d->proc_mem[i];
        infos[i].gpuInstanceId = 0xFFFFFFFF;
        infos[i].computeInstanceId = 0xFFFFFFFF;
    }
    *count = d->nprocs;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(struct fake_dev *d, unsigned int *count,
                                                     fake_process_info *infos) {
    return nvmlDeviceGetComputeRunningProcesses_v3(d, count, infos);
}

/* ---- what says whether a GPU runs slow (issue 38); signatures as in nvml.h ---- */

/* the GPU (parent of a MIG handle), or NULL while a query must fail (lost) */
static struct fake_dev *full(struct fake_dev *d) { return d->is_mig ? &gpus[d->parent] : d; }

#define ATTR_QUERY(fn, which, type)                                                     \
    nvmlReturn_t fn(struct fake_dev *d, type *out) {                                    \
        NEED_INIT();                                                                    \
        if (!out) return NVML_ERROR_INVALID_ARGUMENT;                                   \
        if (d->lost) return NVML_ERROR_GPU_IS_LOST;                                     \
        long long v = full(d)->attr[which];                                             \
        if (v < 0) return NVML_ERROR_NOT_SUPPORTED;                                     \
        *out = (type)v;                                                                 \
        return NVML_SUCCESS;                                                            \
    }

nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(struct fake_dev *d, unsigned int *gen) {
    NEED_INIT();
    if (!gen) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->lost) return NVML_ERROR_GPU_IS_LOST;
    struct fake_dev *g = full(d);
    long long v = g->attr[A_GEN_CUR];
    if (v == AUTO_GEN) v = (g->nprocs > 0 || g->attr[A_UTIL_GPU] > 0) ? g->attr[A_GEN_MAX] : 1;
    if (v < 0) return NVML_ERROR_NOT_SUPPORTED;
    *gen = (unsigned int)v;
    return NVML_SUCCESS;
}
ATTR_QUERY(nvmlDeviceGetCurrPcieLinkWidth, A_WIDTH_CUR, unsigned int)
ATTR_QUERY(nvmlDeviceGetMaxPcieLinkGeneration, A_GEN_MAX, unsigned int)
ATTR_QUERY(nvmlDeviceGetMaxPcieLinkWidth, A_WIDTH_MAX, unsigned int)
ATTR_QUERY(nvmlDeviceGetGpuMaxPcieLinkGeneration, A_GEN_GPU_MAX, unsigned int)
ATTR_QUERY(nvmlDeviceGetPowerUsage, A_POWER, unsigned int)
ATTR_QUERY(nvmlDeviceGetEnforcedPowerLimit, A_POWER_LIMIT, unsigned int)
ATTR_QUERY(nvmlDeviceGetPowerManagementLimit, A_POWER_LIMIT, unsigned int)
ATTR_QUERY(nvmlDeviceGetPowerManagementDefaultLimit, A_POWER_DEFAULT, unsigned int)
ATTR_QUERY(nvmlDeviceGetRetiredPagesPendingStatus, A_RETIRED_PENDING, int)

nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(struct fake_dev *d,
                                                       unsigned long long *reasons) {
    NEED_INIT();
    if (!reasons) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->lost) return NVML_ERROR_GPU_IS_LOST;
    long long v = full(d)->attr[A_REASONS];
    if (v < 0) return NVML_ERROR_NOT_SUPPORTED;
    *reasons = (unsigned long long)v;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(struct fake_dev *d,
                                                    unsigned long long *reasons) {
    NEED_INIT();
    if (full(d)->attr[A_CLOCK_API] == 1) return NVML_ERROR_FUNCTION_NOT_FOUND;
    return nvmlDeviceGetCurrentClocksThrottleReasons(d, reasons);
}

/* nvmlUtilization_t: gpu, memory (percent) */
typedef struct { unsigned int gpu, memory; } fake_utilization;

nvmlReturn_t nvmlDeviceGetUtilizationRates(struct fake_dev *d, fake_utilization *u) {
    NEED_INIT();
    if (!u) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->lost) return NVML_ERROR_GPU_IS_LOST;
    if (d->is_mig || d->attr[A_UTIL_GPU] < 0) return NVML_ERROR_NOT_SUPPORTED;
    u->gpu = (unsigned int)d->attr[A_UTIL_GPU];
    u->memory = d->attr[A_UTIL_MEM] < 0 ? 0 : (unsigned int)d->attr[A_UTIL_MEM];
    return NVML_SUCCESS;
}

/* nvmlClockType_t: 0 graphics, 1 SM, 2 memory, 3 video */
static nvmlReturn_t clock_query(struct fake_dev *d, int type, unsigned int *mhz, int cur) {
    NEED_INIT();
    if (!mhz) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->lost) return NVML_ERROR_GPU_IS_LOST;
    int a = type == 2 ? (cur ? A_MEM : A_MEM_MAX) : (type <= 1 ? (cur ? A_SM : A_SM_MAX) : -1);
    if (a < 0) return NVML_ERROR_NOT_SUPPORTED;
    long long v = full(d)->attr[a];
    if (v < 0) return NVML_ERROR_NOT_SUPPORTED;
    *mhz = (unsigned int)v;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetClockInfo(struct fake_dev *d, int type, unsigned int *mhz) { return clock_query(d, type, mhz, 1); }
nvmlReturn_t nvmlDeviceGetMaxClockInfo(struct fake_dev *d, int type, unsigned int *mhz) { return clock_query(d, type, mhz, 0); }

/* nvmlTemperatureSensors_t 0 = GPU; nvmlTemperatureThresholds_t 0 shutdown, 1 slowdown */
nvmlReturn_t nvmlDeviceGetTemperature(struct fake_dev *d, int sensor, unsigned int *c) {
    NEED_INIT();
    if (!c) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->lost) return NVML_ERROR_GPU_IS_LOST;
    long long v = full(d)->attr[A_TEMP];
    if (sensor != 0 || v < 0) return NVML_ERROR_NOT_SUPPORTED;
    *c = (unsigned int)v;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetTemperatureThreshold(struct fake_dev *d, int which, unsigned int *c) {
    NEED_INIT();
    if (!c) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->lost) return NVML_ERROR_GPU_IS_LOST;
    int a = which == 0 ? A_TEMP_SHUT : (which == 1 ? A_TEMP_SLOW : -1);
    if (a < 0 || full(d)->attr[a] < 0) return NVML_ERROR_NOT_SUPPORTED;
    *c = (unsigned int)full(d)->attr[a];
    return NVML_SUCCESS;
}

/* NVLink: links 0..nvlinks-1 answer; the rest are INVALID_ARGUMENT, as on a GPU with fewer */
nvmlReturn_t nvmlDeviceGetNvLinkState(struct fake_dev *d, unsigned int link, unsigned int *active) {
    NEED_INIT();
    if (!active) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->lost) return NVML_ERROR_GPU_IS_LOST;
    struct fake_dev *g = full(d);
    if (g->attr[A_NVLINKS] <= 0) return NVML_ERROR_NOT_SUPPORTED;
    if (link >= (unsigned)g->attr[A_NVLINKS] || link >= MAX_LINKS) return NVML_ERROR_INVALID_ARGUMENT;
    *active = (g->attr[A_NVLINK_DOWN] >> link) & 1 ? 0 : 1;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(struct fake_dev *d, unsigned int link, int counter,
                                             unsigned long long *n) {
    NEED_INIT();
    if (!n) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->lost) return NVML_ERROR_GPU_IS_LOST;
    struct fake_dev *g = full(d);
    if (g->attr[A_NVLINKS] <= 0) return NVML_ERROR_NOT_SUPPORTED;
    if (link >= (unsigned)g->attr[A_NVLINKS] || link >= MAX_LINKS) return NVML_ERROR_INVALID_ARGUMENT;
    if (counter < 0 || counter > 3) return NVML_ERROR_NOT_SUPPORTED;
    *n = g->nvlink_err[link][counter];
    return NVML_SUCCESS;
}

/* NVLink remote end: the peer GPU's PCI info (nvmlPciInfo_t), as nvml.h's _v2 call */
nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(struct fake_dev *d, unsigned int link,
                                                 fake_pci_info *p) {
    NEED_INIT();
    if (!p) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->lost) return NVML_ERROR_GPU_IS_LOST;
    struct fake_dev *g = full(d);
    if (g->attr[A_NVLINKS] <= 0) return NVML_ERROR_NOT_SUPPORTED;
    if (link >= (unsigned)g->attr[A_NVLINKS] || link >= MAX_LINKS) return NVML_ERROR_INVALID_ARGUMENT;
    int peer = g->nvlink_remote[link] - 1;
    if (peer < 0 || peer >= ngpus) return NVML_ERROR_NOT_SUPPORTED;
    return nvmlDeviceGetPciInfo_v3(&gpus[peer], p);
}

/* nvmlDeviceGetP2PStatus(dev1, dev2, nvmlGpuP2PCapsIndex_t, nvmlGpuP2PStatus_t *) */
nvmlReturn_t nvmlDeviceGetP2PStatus(struct fake_dev *a, struct fake_dev *b, int caps,
                                    int *status) {
    NEED_INIT();
    if (!status || !a || !b || caps < 0 || caps > 5) return NVML_ERROR_INVALID_ARGUMENT;
    if (a->lost || b->lost) return NVML_ERROR_GPU_IS_LOST;
    a = full(a); b = full(b);
    if (b->index < 0 || b->index >= MAX_GPUS) return NVML_ERROR_INVALID_ARGUMENT;
    *status = a->p2p[b->index][caps];
    return NVML_SUCCESS;
}

/* nvmlGpuVirtualizationMode_t: 0 none (bare metal), 1 pass-through, 2 vGPU, 3 host vGPU */
nvmlReturn_t nvmlDeviceGetVirtualizationMode(struct fake_dev *d, int *mode) {
    NEED_INIT();
    if (!mode) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->lost) return NVML_ERROR_GPU_IS_LOST;
    long long v = full(d)->attr[A_VIRT_MODE];
    if (v < 0) return NVML_ERROR_NOT_SUPPORTED;
    *mode = (int)v;
    return NVML_SUCCESS;
}
