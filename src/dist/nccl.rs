//! The device-memory reduction on NVIDIA GPUs: NCCL's allreduce over a Vulkan buffer that
//! CUDA maps (cudarc, with libcuda and libnccl loaded when the run starts, not linked).
//!
//! The gradient bucket is one exported Vulkan buffer (`vulkan_export`), imported into the
//! CUDA device of the same UUID. A step's `average`:
//! 1. waits for this rank's backward (a fence: `Device::sync`), then records copies of every
//!    gradient chunk into the bucket (under mixed precision, f16: each chunk divided by the
//!    world size and cast first, half the bytes on the wire) and waits for them;
//! 2. runs NCCL's allreduce (f32: the mean, `ncclAvg`; f16: the sum of the divided chunks)
//!    on a CUDA stream, and the loss's own f32 allreduce, and waits for the stream, polling
//!    it against `DistOptions::timeout` (a rank that died ends the job: the communicator is
//!    aborted, then MPI's);
//! 3. records copies back into the gradients (and the f16 sums cast back to f32), which run
//!    in order before the optimizer's work.
//!
//! NCCL gives every rank the same bits (each element is reduced on one rank, then copied), so
//! the ranks' weights stay identical. The fences stand where semaphores could: the wait for
//! the backward is the host's anyway (the step's loss scale decision reads it), and the
//! copies take under a millisecond at the shapes measured (docs/DISTRIBUTED.md).

use std::ffi::CStr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use cudarc::driver::sys as cu;
use cudarc::nccl::sys as nc;

use super::vulkan_export::{self, ExportedBuffer};
use super::{error, Collective, Reduction};
use crate::error::{Error, Result};
use crate::graph::{DType, Device, Tensor};
use crate::nn::Parameters;

/// PCI vendor id of NVIDIA.
const NVIDIA: u32 = 0x10de;

/// How long the host sleeps between two polls of the CUDA stream.
const POLL_INTERVAL: Duration = Duration::from_micros(20);

/// Whether NCCL can reduce on `device`: an NVIDIA adapter under Vulkan that exports memory,
/// with libcuda and libnccl found.
pub fn applies(device: &Device) -> bool {
    unavailable(device).is_none()
}

/// Why NCCL cannot reduce on `device`, if it cannot.
fn unavailable(device: &Device) -> Option<String> {
    let info = &device.gpu().info;
    if info.backend != wgpu::Backend::Vulkan || info.vendor != NVIDIA {
        return Some(format!(
            "NCCL needs an NVIDIA GPU under Vulkan; this rank's adapter is {} ({:?})",
            info.name, info.backend
        ));
    }
    if !vulkan_export::can_export(device) {
        return Some("the Vulkan device has no VK_KHR_external_memory_fd".into());
    }
    // SAFETY: only tries to load the libraries.
    if !unsafe { cu::is_culib_present() } {
        return Some("libcuda (the NVIDIA driver's CUDA library) was not found".into());
    }
    // SAFETY: as above.
    if !unsafe { nc::is_culib_present() } {
        return Some(
            "libnccl.so was not found on the loader's path (LD_LIBRARY_PATH: libnccl2's, or a \
             directory with a libnccl.so link to PyTorch's nvidia/nccl/lib/libnccl.so.2)"
                .into(),
        );
    }
    None
}

fn cuda(what: &str, r: cu::CUresult) -> std::result::Result<(), String> {
    if r == cu::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let mut text: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: cuGetErrorString writes a static string or leaves it null.
    unsafe { cu::cuGetErrorString(r, &mut text) };
    let text = if text.is_null() {
        format!("{r:?}")
    } else {
        // SAFETY: a NUL-terminated static string.
        unsafe { CStr::from_ptr(text) }
            .to_string_lossy()
            .into_owned()
    };
    Err(format!("{what} failed: {text}"))
}

fn nccl(what: &str, r: nc::ncclResult_t) -> std::result::Result<(), String> {
    if r == nc::ncclResult_t::ncclSuccess {
        return Ok(());
    }
    // SAFETY: ncclGetErrorString returns a static NUL-terminated string.
    let text = unsafe { CStr::from_ptr(nc::ncclGetErrorString(r)) };
    Err(format!("{what} failed: {}", text.to_string_lossy()))
}

/// The gradient bucket: the exported Vulkan buffer and where CUDA maps it.
struct Bucket {
    buffer: ExportedBuffer,
    memory: cu::CUexternalMemory,
    pointer: cu::CUdeviceptr,
    /// Bytes of gradients (the loss's 4 follow).
    grad_bytes: u64,
}

/// NCCL's allreduce over a bucket of device memory (module docs).
pub struct NcclReduction {
    collective: Rc<dyn Collective>,
    device: Device,
    context: cu::CUcontext,
    cu_device: cu::CUdevice,
    stream: cu::CUstream,
    comm: nc::ncclComm_t,
    bucket: Option<Bucket>,
    /// When the allreduce `finish` waits for was started.
    started: Option<Instant>,
    /// f16 on the wire (a mixed-precision run), else f32.
    half: bool,
    timeout: Duration,
    last: Duration,
}

impl NcclReduction {
    /// NCCL's communicator over `collective`'s ranks (rank 0's identifier broadcast through
    /// it), on the CUDA device that is `device`'s GPU. f16 on the wire where `half`.
    pub fn new(collective: Rc<dyn Collective>, device: &Device, half: bool) -> Result<Self> {
        let c = collective.as_ref();
        if let Some(why) = unavailable(device) {
            return Err(error(c, format!("--reduce nccl: {why}")));
        }
        let uuid = vulkan_export::device_uuid(device)
            .ok_or_else(|| error(c, "--reduce nccl: the adapter is not a Vulkan one"))?;
        let (context, cu_device, stream) = cuda_context(&uuid).map_err(|e| error(c, e))?;
        let mut id = nc::ncclUniqueId { internal: [0; 128] };
        if c.rank() == 0 {
            // SAFETY: writes the identifier.
            nccl("ncclGetUniqueId", unsafe { nc::ncclGetUniqueId(&mut id) })
                .map_err(|e| error(c, e))?;
        }
        let mut bytes: Vec<u8> = id.internal.iter().map(|&b| b as u8).collect();
        c.broadcast_bytes(&mut bytes, 0)?;
        for (d, b) in id.internal.iter_mut().zip(&bytes) {
            *d = *b as std::ffi::c_char;
        }
        let mut comm: nc::ncclComm_t = std::ptr::null_mut();
        // SAFETY: every rank calls it with the same identifier and world size, its own rank;
        // the current CUDA context is this GPU's.
        nccl("ncclCommInitRank", unsafe {
            nc::ncclCommInitRank(&mut comm, c.world_size() as i32, id, c.rank() as i32)
        })
        .map_err(|e| error(c, e))?;
        Ok(NcclReduction {
            timeout: device.options().dist.timeout,
            collective,
            device: device.clone(),
            context,
            cu_device,
            stream,
            comm,
            bucket: None,
            started: None,
            half,
            last: Duration::ZERO,
        })
    }

    /// Makes the bucket (or remakes it) to hold `grad_bytes` and the loss.
    fn ensure_bucket(&mut self, grad_bytes: u64) -> Result<()> {
        if self
            .bucket
            .as_ref()
            .is_some_and(|b| b.grad_bytes == grad_bytes)
        {
            return Ok(());
        }
        if let Some(old) = self.bucket.take() {
            // SAFETY: the stream is idle (every `average` waits for it).
            unsafe { release(old) };
        }
        let c = self.collective.as_ref();
        let size = grad_bytes + 4;
        let buffer = vulkan_export::export_buffer(&self.device, size)?;
        let desc = cu::CUDA_EXTERNAL_MEMORY_HANDLE_DESC {
            type_: cu::CUexternalMemoryHandleType::CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD,
            handle: cu::CUDA_EXTERNAL_MEMORY_HANDLE_DESC_st__bindgen_ty_1 { fd: buffer.fd },
            size: buffer.allocation_size,
            // A dedicated allocation (`export_buffer`).
            flags: 1,
            reserved: [0; 16],
        };
        let mut memory: cu::CUexternalMemory = std::ptr::null_mut();
        // SAFETY: the fd is an opaque-fd export of `allocation_size` bytes; on success CUDA
        // owns the fd. The context is current on this thread.
        cuda("cuImportExternalMemory", unsafe {
            cu::cuCtxSetCurrent(self.context);
            cu::cuImportExternalMemory(&mut memory, &desc)
        })
        .map_err(|e| error(c, e))?;
        let map = cu::CUDA_EXTERNAL_MEMORY_BUFFER_DESC {
            offset: 0,
            size,
            flags: 0,
            reserved: [0; 16],
        };
        let mut pointer: cu::CUdeviceptr = 0;
        // SAFETY: maps the first `size` bytes of the imported allocation.
        cuda("cuExternalMemoryGetMappedBuffer", unsafe {
            cu::cuExternalMemoryGetMappedBuffer(&mut pointer, memory, &map)
        })
        .map_err(|e| error(c, e))?;
        self.bucket = Some(Bucket {
            buffer,
            memory,
            pointer,
            grad_bytes,
        });
        Ok(())
    }

    /// Polls the stream until its work is done, or aborts the job naming the wait once the
    /// timeout has passed.
    fn wait_stream(&self) -> Result<()> {
        let c = self.collective.as_ref();
        let start = Instant::now();
        loop {
            // SAFETY: a live stream of the current context.
            let r = unsafe { cu::cuStreamQuery(self.stream) };
            match r {
                cu::CUresult::CUDA_SUCCESS => return Ok(()),
                cu::CUresult::CUDA_ERROR_NOT_READY => {}
                r => return cuda("the NCCL stream", r).map_err(|e| error(c, e)),
            }
            let mut async_error = nc::ncclResult_t::ncclSuccess;
            // SAFETY: a live communicator.
            unsafe { nc::ncclCommGetAsyncError(self.comm, &mut async_error) };
            if async_error != nc::ncclResult_t::ncclSuccess {
                // SAFETY: the communicator is not used again.
                unsafe { nc::ncclCommAbort(self.comm) };
                let e = nccl("NCCL's allreduce", async_error).unwrap_err();
                c.abort(&e);
            }
            if start.elapsed() > self.timeout {
                // SAFETY: as above.
                unsafe { nc::ncclCommAbort(self.comm) };
                c.abort(&format!(
                    "NCCL's gradient allreduce waited {} s for the other ranks \
                     (WGRAD_DIST_TIMEOUT_S): one of them has died or hangs",
                    self.timeout.as_secs()
                ));
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    }
}

/// The primary context and a non-blocking stream of the CUDA device whose UUID is `uuid`.
fn cuda_context(
    uuid: &[u8; 16],
) -> std::result::Result<(cu::CUcontext, cu::CUdevice, cu::CUstream), String> {
    // SAFETY: plain driver calls with valid out-pointers.
    unsafe {
        cuda("cuInit", cu::cuInit(0))?;
        let mut count = 0;
        cuda("cuDeviceGetCount", cu::cuDeviceGetCount(&mut count))?;
        for i in 0..count {
            let mut dev = 0;
            cuda("cuDeviceGet", cu::cuDeviceGet(&mut dev, i))?;
            let mut id = cu::CUuuid { bytes: [0; 16] };
            cuda("cuDeviceGetUuid", cu::cuDeviceGetUuid_v2(&mut id, dev))?;
            if id.bytes.iter().map(|&b| b as u8).eq(uuid.iter().copied()) {
                let mut ctx = std::ptr::null_mut();
                cuda(
                    "cuDevicePrimaryCtxRetain",
                    cu::cuDevicePrimaryCtxRetain(&mut ctx, dev),
                )?;
                cuda("cuCtxSetCurrent", cu::cuCtxSetCurrent(ctx))?;
                let mut stream = std::ptr::null_mut();
                let flags = cu::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
                cuda("cuStreamCreate", cu::cuStreamCreate(&mut stream, flags))?;
                return Ok((ctx, dev, stream));
            }
        }
        Err(format!(
            "none of CUDA's {count} devices is the Vulkan adapter's (UUID {})",
            uuid.iter().map(|b| format!("{b:02x}")).collect::<String>()
        ))
    }
}

/// Unmaps and releases a bucket's CUDA side; wgpu frees its memory when the buffer drops.
///
/// # Safety
/// No CUDA work may still use it.
unsafe fn release(bucket: Bucket) {
    unsafe {
        cu::cuMemFree_v2(bucket.pointer);
        cu::cuDestroyExternalMemory(bucket.memory);
    }
    drop(bucket.buffer);
}

impl Reduction for NcclReduction {
    fn describe(&self) -> String {
        format!(
            "NCCL allreduce in device memory (a Vulkan buffer CUDA maps), {}",
            if self.half { "f16" } else { "f32" }
        )
    }

    fn average(&mut self, params: &Parameters, loss: &Tensor) -> Result<Tensor> {
        let dev = params.device().clone();
        let world = self.collective.world_size();
        if loss.dtype() != DType::F32 || loss.numel() != 1 {
            return Err(Error::InvalidArgument {
                op: "Reduction::average",
                reason: format!(
                    "the loss is {:?} of {} elements, not one f32",
                    loss.dtype(),
                    loss.numel()
                ),
            });
        }
        // Unwritten gradients hold stale values: zeroed so none travels (`HostReduction`).
        params.zero_unwritten_grads()?;
        let half = self.half && params.chunks.iter().all(|ch| ch.numel % 2 == 0);
        let elem = if half { 2 } else { 4 };
        let grad_bytes: u64 = params
            .chunks
            .iter()
            .map(|ch| (ch.numel * elem) as u64)
            .sum();
        // Under f16, each chunk divided by the world size and cast (the wire's sum is then
        // the mean, and cannot overflow where the mean would not).
        let staged: Vec<Tensor> = if half {
            let inv = 1.0 / world as f32;
            params
                .chunks
                .iter()
                .map(|ch| ch.grad.mul_scalar(inv)?.to_dtype(DType::F16))
                .collect::<Result<_>>()?
        } else {
            params.chunks.iter().map(|ch| ch.grad.clone()).collect()
        };
        self.ensure_bucket(grad_bytes)?;
        let bucket = self.bucket.as_ref().expect("just made");
        let (buffer, pointer) = (&bucket.buffer.buffer, bucket.pointer);
        let mut at = 0;
        for (ch, t) in params.chunks.iter().zip(&staged) {
            let bytes = (ch.numel * elem) as u64;
            dev.copy_to_external((t.storage(), 0), (buffer, at), bytes)?;
            at += bytes;
        }
        let loss_at = loss.layout().offset as u64 * 4;
        dev.copy_to_external((loss.storage(), loss_at), (buffer, at), 4)?;
        // One wait for the backward and the copies: then CUDA may read the bucket.
        dev.sync()?;
        let _span = tracing::info_span!("gradient reduction").entered();
        let c = self.collective.as_ref();
        let count = (grad_bytes / elem as u64) as usize;
        let (dtype, op) = if half {
            (nc::ncclDataType_t::ncclFloat16, nc::ncclRedOp_t::ncclSum)
        } else {
            (nc::ncclDataType_t::ncclFloat32, nc::ncclRedOp_t::ncclAvg)
        };
        let stream = self.stream as nc::cudaStream_t;
        self.started = Some(Instant::now());
        // SAFETY: the bucket is mapped at `pointer` for `grad_bytes + 4` bytes; the Vulkan
        // copies into it have finished (the sync above); every rank makes the same calls.
        unsafe {
            cuda("cuCtxSetCurrent", cu::cuCtxSetCurrent(self.context)).map_err(|e| error(c, e))?;
            let p = pointer as *mut std::ffi::c_void;
            nccl(
                "ncclAllReduce (gradients)",
                nc::ncclAllReduce(p, p, count, dtype, op, self.comm, stream),
            )
            .map_err(|e| error(c, e))?;
            let l = (pointer + grad_bytes) as *mut std::ffi::c_void;
            let f32 = nc::ncclDataType_t::ncclFloat32;
            let avg = nc::ncclRedOp_t::ncclAvg;
            nccl(
                "ncclAllReduce (loss)",
                nc::ncclAllReduce(l, l, 1, f32, avg, self.comm, stream),
            )
            .map_err(|e| error(c, e))?;
        }
        // While NCCL runs: the copies back (and the f16 means cast back to f32 in place), then
        // whatever the caller records, held until `finish` has waited for the stream.
        dev.hold_submits("NCCL's allreduce writes the gradient bucket");
        let mut at = 0;
        for (ch, t) in params.chunks.iter().zip(&staged) {
            let bytes = (ch.numel * elem) as u64;
            dev.copy_from_external((buffer, at), (t.storage(), 0), bytes)?;
            if half {
                t.cast_into(&ch.grad)?;
            }
            at += bytes;
        }
        let mean_loss = Tensor::zeros(&dev, &[])?;
        dev.copy_from_external((buffer, at), (mean_loss.storage(), 0), 4)?;
        Ok(mean_loss)
    }

    fn finish(&mut self) -> Result<()> {
        let Some(started) = self.started.take() else {
            return Ok(());
        };
        let _span = tracing::info_span!("gradient reduction").entered();
        let waited = self.wait_stream();
        self.device.release_submits();
        self.last = started.elapsed();
        waited
    }

    fn last_time(&self) -> Duration {
        self.last
    }
}

impl Drop for NcclReduction {
    fn drop(&mut self) {
        // SAFETY: every `average` waited for the stream; nothing uses these after.
        unsafe {
            cu::cuCtxSetCurrent(self.context);
            cu::cuStreamSynchronize(self.stream);
            nc::ncclCommDestroy(self.comm);
            if let Some(bucket) = self.bucket.take() {
                release(bucket);
            }
            cu::cuStreamDestroy_v2(self.stream);
            cu::cuDevicePrimaryCtxRelease_v2(self.cu_device);
        }
    }
}
