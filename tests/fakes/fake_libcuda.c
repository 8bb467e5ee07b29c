/*
 * fake_libcuda: a stand-in libcuda.so.1 for the CUDA-call probe (bpf/cuda_calls.bpf.c).
 *
 * Why: uprobes need a real shared object with real symbols, and the interesting failure is the
 * real one: cuInit opening /dev/nvidia-uvm and the kernel's device cgroup answering EPERM.
 * Behaviour, from the environment of the calling process:
 *   FAKE_CUDA_UVM          the path cuInit opens O_RDWR (default /dev/nvidia-uvm); if that open
 *                          fails, cuInit returns CUDA_ERROR_UNKNOWN (999), as the real driver
 *                          library does when it cannot open the UVM device
 *   FAKE_CUDA_INIT_RESULT  what cuInit returns otherwise (default 0, CUDA_SUCCESS)
 *   FAKE_CUDA_ALLOC_RESULT what cuMemAlloc_v2 returns (default 0)
 * Only the driver-API calls the probe watches exist; handles are dummies.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;

static int initialized;

static int env_int(const char *name, int dflt) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) : dflt;
}

__attribute__((noinline)) CUresult cuInit(unsigned int flags) {
    (void)flags;
    const char *uvm = getenv("FAKE_CUDA_UVM");
    int fd = open(uvm && *uvm ? uvm : "/dev/nvidia-uvm", O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return 999;                       /* CUDA_ERROR_UNKNOWN */
    close(fd);
    CUresult rc = env_int("FAKE_CUDA_INIT_RESULT", 0);
    initialized = rc == 0;
    return rc;
}

__attribute__((noinline)) CUresult cuDeviceGetCount(int *count) {
    if (!initialized) return 3;           /* CUDA_ERROR_NOT_INITIALIZED */
    *count = 1;
    return 0;
}

__attribute__((noinline)) CUresult cuDeviceGet(CUdevice *dev, int ordinal) {
    if (!initialized) return 3;
    if (ordinal != 0) return 101;         /* CUDA_ERROR_INVALID_DEVICE */
    *dev = 0;
    return 0;
}

__attribute__((noinline)) CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev) {
    if (!initialized) return 3;
    if (dev != 0) return 101;
    *ctx = (CUcontext)&initialized;
    return 0;
}

__attribute__((noinline)) CUresult cuCtxCreate_v2(CUcontext *ctx, unsigned int flags, CUdevice dev) {
    (void)flags;
    return cuDevicePrimaryCtxRetain(ctx, dev);
}

__attribute__((noinline)) CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t size) {
    if (!initialized) return 3;
    CUresult rc = env_int("FAKE_CUDA_ALLOC_RESULT", 0);
    if (rc == 0) *p = (CUdeviceptr)(size ? 0x7f0000000000ULL : 0);
    return rc;
}
