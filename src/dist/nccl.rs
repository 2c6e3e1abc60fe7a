//! The device-memory reduction on NVIDIA GPUs: NCCL's allreduce over gradients that live in
//! Vulkan memory CUDA maps (cudarc, with libcuda and libnccl loaded when the run starts, not
//! linked).
//!
//! `attach` moves each parameter chunk's gradient into a bucket: one Vulkan buffer exported
//! as an opaque fd (`vulkan_export`), imported into the CUDA device of the same UUID; the
//! first bucket has one more element, for the step's loss. The backward writes the gradients
//! there as anywhere else. A step's `average`:
//! 1. records a copy of the loss into its slot and waits for this rank's step so far (a
//!    fence: `Device::sync`);
//! 2. starts NCCL's allreduce of every bucket (f32, `ncclAvg`: the gradients as the backward
//!    made them, f32 under --amp as without) on a CUDA stream, and records the copy of the
//!    mean loss back; the caller then records the optimizer, held (`Device::hold_submits`);
//! 3. `finish` waits for the stream, polling it against `DistOptions::timeout` (a rank that
//!    died ends the job: the communicator is aborted, then MPI's), and lets the optimizer go.
//!
//! NCCL gives every rank the same bits (each element is reduced on one rank, then copied), so
//! the ranks' weights stay identical. Nothing is copied but the loss; the fences stand where
//! semaphores could, the wait for the backward being one the step makes anyway.

use std::ffi::CStr;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd};
use std::rc::Rc;
use std::time::{Duration, Instant};

use cudarc::driver::sys as cu;
use cudarc::nccl::sys as nc;

use super::vulkan_export;
use super::{check_loss, error, Collective, Reduction};
use crate::error::Result;
use crate::graph::{DType, Device, Layout, Tensor};
use crate::nn::Parameters;

/// PCI vendor id of NVIDIA.
const NVIDIA: u32 = 0x10de;

/// How long the host sleeps between two polls of the CUDA stream.
const POLL_INTERVAL: Duration = Duration::from_micros(20);

/// Why NCCL cannot reduce over `world` on its ranks' devices, if it cannot, agreed by every
/// rank: a rank whose adapter is not an NVIDIA GPU under Vulkan that exports memory, or that
/// lacks libcuda or libnccl; or two ranks on one GPU (NCCL refuses them).
pub fn agreed_unavailable(world: &dyn Collective, device: &Device) -> Result<Option<String>> {
    let mine = unavailable(device);
    if world.any(mine.is_some())? {
        return Ok(Some(
            mine.unwrap_or_else(|| "another rank cannot run it".into()),
        ));
    }
    // Every rank's GPU, by UUID: one small broadcast a rank.
    let uuid = vulkan_export::device_uuid(device).unwrap_or_default();
    let mut seen: Vec<Vec<u8>> = Vec::new();
    for r in 0..world.world_size() {
        let mut theirs = if r == world.rank() {
            uuid.to_vec()
        } else {
            vec![0; 16]
        };
        world.broadcast_bytes(&mut theirs, r)?;
        if let Some(first) = seen.iter().position(|u| *u == theirs) {
            return Ok(Some(format!(
                "ranks {first} and {r} share one GPU, and NCCL needs a GPU a rank"
            )));
        }
        seen.push(theirs);
    }
    Ok(None)
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

/// One chunk's gradients in exported memory: the tensor over it (the chunk's gradient and,
/// in the first, the loss's slot after it) and where CUDA maps it.
struct Bucket {
    tensor: Tensor,
    memory: cu::CUexternalMemory,
    pointer: cu::CUdeviceptr,
}

/// NCCL's allreduce over a bucket of device memory (module docs).
pub struct NcclReduction {
    collective: Rc<dyn Collective>,
    device: Device,
    context: cu::CUcontext,
    cu_device: cu::CUdevice,
    stream: cu::CUstream,
    comm: nc::ncclComm_t,
    /// One a parameter chunk, made by `attach`.
    buckets: Vec<Bucket>,
    /// When the allreduce `finish` waits for was started.
    started: Option<Instant>,
    timeout: Duration,
    last: Duration,
}

impl NcclReduction {
    /// NCCL's communicator over `collective`'s ranks (rank 0's identifier broadcast through
    /// it), on the CUDA device that is `device`'s GPU; the ranks have agreed that NCCL can run
    /// (`agreed_unavailable`).
    pub fn new(collective: Rc<dyn Collective>, device: &Device) -> Result<Self> {
        let c = collective.as_ref();
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
            buckets: Vec::new(),
            started: None,
            last: Duration::ZERO,
        })
    }

    /// A zeroed bucket of `elems` f32 in exported memory, mapped into CUDA.
    fn bucket(&self, elems: usize) -> Result<Bucket> {
        let c = self.collective.as_ref();
        let size = elems as u64 * 4;
        let exported = vulkan_export::export_buffer(&self.device, size)?;
        // Owned until CUDA's import takes it (closed here on any error before).
        // SAFETY: a descriptor vkGetMemoryFdKHR returned to us alone.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(exported.fd) };
        let desc = cu::CUDA_EXTERNAL_MEMORY_HANDLE_DESC {
            type_: cu::CUexternalMemoryHandleType::CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD,
            handle: cu::CUDA_EXTERNAL_MEMORY_HANDLE_DESC_st__bindgen_ty_1 { fd: fd.as_raw_fd() },
            size: exported.allocation_size,
            // A dedicated allocation (`export_buffer`).
            flags: 1,
            reserved: [0; 16],
        };
        let mut memory: cu::CUexternalMemory = std::ptr::null_mut();
        // SAFETY: the fd is an opaque-fd export of `allocation_size` bytes. The context is
        // made current on this thread first.
        unsafe {
            cuda("cuCtxSetCurrent", cu::cuCtxSetCurrent(self.context))
                .and_then(|()| {
                    cuda(
                        "cuImportExternalMemory",
                        cu::cuImportExternalMemory(&mut memory, &desc),
                    )
                })
                .map_err(|e| error(c, e))?;
        }
        // CUDA owns the descriptor now.
        let _ = fd.into_raw_fd();
        let map = cu::CUDA_EXTERNAL_MEMORY_BUFFER_DESC {
            offset: 0,
            size,
            flags: 0,
            reserved: [0; 16],
        };
        let mut pointer: cu::CUdeviceptr = 0;
        // SAFETY: maps the first `size` bytes of the imported allocation.
        let mapped = cuda("cuExternalMemoryGetMappedBuffer", unsafe {
            cu::cuExternalMemoryGetMappedBuffer(&mut pointer, memory, &map)
        });
        if let Err(e) = mapped {
            // SAFETY: imported above, not mapped.
            unsafe { cu::cuDestroyExternalMemory(memory) };
            return Err(error(c, e));
        }
        let made = self
            .device
            .wrap_external(exported.buffer)
            .and_then(|storage| {
                let tensor = Tensor::from_parts(storage, Layout::contiguous(&[elems]), DType::F32);
                tensor.fill_(0.0).map(|()| tensor)
            });
        let tensor = match made {
            Ok(t) => t,
            Err(e) => {
                // SAFETY: mapped and imported above, used by no CUDA work yet.
                unsafe {
                    cu::cuMemFree_v2(pointer);
                    cu::cuDestroyExternalMemory(memory);
                }
                return Err(e);
            }
        };
        Ok(Bucket {
            tensor,
            memory,
            pointer,
        })
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

/// Unmaps and releases a bucket's CUDA side; wgpu frees its memory once the last tensor
/// over it is dropped.
///
/// # Safety
/// No CUDA work may still use it.
unsafe fn release(bucket: Bucket) {
    unsafe {
        cu::cuMemFree_v2(bucket.pointer);
        cu::cuDestroyExternalMemory(bucket.memory);
    }
}

impl Reduction for NcclReduction {
    fn collective(&self) -> &Rc<dyn Collective> {
        &self.collective
    }

    fn describe(&self) -> String {
        "NCCL allreduce of the f32 gradients in device memory (Vulkan buffers CUDA maps)".into()
    }

    fn attach(&mut self, params: &mut Parameters) -> Result<()> {
        for c in 0..params.chunks.len() {
            let numel = params.chunks[c].numel;
            // The first bucket's element after the gradients is the loss's (one allreduce);
            // the chunk's length is a multiple of 4, so the next 4 keep 16-byte alignment.
            let bucket = self.bucket(numel + if c == 0 { 4 } else { 0 })?;
            let grad = bucket.tensor.with_layout(Layout::contiguous(&[numel]));
            self.buckets.push(bucket);
            params.move_grad(c, grad)?;
        }
        Ok(())
    }

    fn average(&mut self, params: &Parameters, loss: &Tensor) -> Result<Tensor> {
        let dev = params.device().clone();
        let c = self.collective.as_ref();
        check_loss(loss)?;
        if self.buckets.len() != params.chunks.len() {
            return Err(error(
                c,
                "NCCL's buckets were not attached to these parameters",
            ));
        }
        // Unwritten gradients hold stale values: zeroed so none travels (`HostReduction`).
        params.zero_unwritten_grads()?;
        let loss_slot = params.chunks[0].numel as u64 * 4;
        let first = self.buckets[0].tensor.storage();
        let loss_at = loss.layout().offset as u64 * 4;
        dev.copy_storage_at((loss.storage(), loss_at), (first, loss_slot), 4)?;
        // Written by the copy back, whole: no fill.
        let mean_loss = Tensor::uninit(&dev, &[], DType::F32, "Reduction::average")?;
        // The backward and the copy done: CUDA may read the buckets.
        dev.sync()?;
        let _span = tracing::info_span!("gradient reduction").entered();
        let stream = self.stream as nc::cudaStream_t;
        self.started = Some(Instant::now());
        // SAFETY: each bucket is mapped at its pointer for its tensor's length; the Vulkan
        // work writing them has finished (the sync above); every rank makes the same calls.
        unsafe {
            cuda("cuCtxSetCurrent", cu::cuCtxSetCurrent(self.context)).map_err(|e| error(c, e))?;
            // One launch for all the buckets (a model past the binding limit has several).
            nccl("ncclGroupStart", nc::ncclGroupStart()).map_err(|e| error(c, e))?;
            for (i, b) in self.buckets.iter().enumerate() {
                // The loss's slot travels with the first bucket's gradients.
                let count = params.chunks[i].numel + usize::from(i == 0);
                let p = b.pointer as *mut std::ffi::c_void;
                let (f32, avg) = (nc::ncclDataType_t::ncclFloat32, nc::ncclRedOp_t::ncclAvg);
                nccl(
                    "ncclAllReduce",
                    nc::ncclAllReduce(p, p, count, f32, avg, self.comm, stream),
                )
                .map_err(|e| error(c, e))?;
            }
            nccl("ncclGroupEnd", nc::ncclGroupEnd()).map_err(|e| error(c, e))?;
        }
        // Recorded while NCCL runs, submitted once `finish` has waited for it (at once where
        // the copy cannot be recorded, so that no error leaves the device held).
        dev.hold_submits("NCCL's allreduce writes the gradient buckets");
        let copied = dev.copy_storage_at((first, loss_slot), (mean_loss.storage(), 0), 4);
        if copied.is_err() {
            self.finish()?;
        }
        copied.map(|()| mean_loss)
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
        // SAFETY: nothing uses these after; the stream is idle or its communicator aborted.
        unsafe {
            cu::cuCtxSetCurrent(self.context);
            if self.started.is_some() {
                // An allreduce `finish` never waited for (an error on the way): NCCL may be
                // waiting for a rank that is gone; abort the communicator, do not wait.
                nc::ncclCommAbort(self.comm);
            } else {
                cu::cuStreamSynchronize(self.stream);
                nc::ncclCommDestroy(self.comm);
            }
            for bucket in self.buckets.drain(..) {
                release(bucket);
            }
            cu::cuStreamDestroy_v2(self.stream);
            cu::cuDevicePrimaryCtxRelease_v2(self.cu_device);
        }
    }
}
