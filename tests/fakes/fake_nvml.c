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
 *   driver_version=570.158.01      nvml_version=12.570.158.01     cuda_version=12080
 *   gpu=<uuid>|<name>|<minor>|<mig 0/1>|<ecc uncorrected>|<remap pending 0/1>|<remap failed 0/1>
 *   mig=<gpu index>|<uuid>|<name>|<gpu instance id>|<compute instance id>
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

#define MAX_GPUS 16
#define MAX_MIG 8

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
    int nmig;
    struct fake_dev *migs[MAX_MIG];
};

static struct fake_dev gpus[MAX_GPUS];
static struct fake_dev migs[MAX_GPUS * MAX_MIG];
static int ngpus, nmigs_total;
static char init_mode[64] = "ok";
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
        else if (!strcmp(k, "driver_version")) snprintf(driver_version, sizeof driver_version, "%s", v);
        else if (!strcmp(k, "nvml_version")) snprintf(nvml_version, sizeof nvml_version, "%s", v);
        else if (!strcmp(k, "cuda_version")) cuda_version = atoi(v);
        else if (!strcmp(k, "gpu") && ngpus < MAX_GPUS) {
            char *fl[7];
            split(v, fl, 7);
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
            ngpus++;
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
    *pending = d->mig_mode;
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
    *count = errorType == 1 ? d->ecc_uncorrected : 0;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetRemappedRows(struct fake_dev *d, unsigned int *corr, unsigned int *unc,
                                       unsigned int *pending, unsigned int *failure) {
    NEED_INIT();
    if (d->is_mig) return NVML_ERROR_NOT_SUPPORTED;
    *corr = 0;
    *unc = d->remap_pending || d->remap_failed ? 1 : 0;
    *pending = d->remap_pending;
    *failure = d->remap_failed;
    return NVML_SUCCESS;
}
