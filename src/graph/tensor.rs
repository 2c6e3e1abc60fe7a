//! `Tensor`: a view (Layout) over pooled storage on a Device. Cloning a Tensor is cheap and
//! shares the storage; the buffer goes back to the pool when the last view drops.

use std::sync::Arc;

use super::device::{Device, Storage};
use super::layout::Layout;
use crate::error::{Error, Result};

pub use crate::kernels::DType;

#[derive(Clone)]
pub struct Tensor(Arc<TensorInner>);

/// What a layer above attaches to a tensor (the autograd tape's record); opaque here.
pub type Attachment = Arc<dyn std::any::Any + Send + Sync>;

struct TensorInner {
    layout: Layout,
    dtype: DType,
    storage: Arc<Storage>,
    attachment: Option<Attachment>,
    /// The host values of a u32 tensor made from host data (index tensors), kept so that
    /// backward can group positions by index without reading the GPU.
    host_u32: Option<Arc<[u32]>>,
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tensor({:?}, {:?})", self.shape(), self.dtype())
    }
}

impl Tensor {
    /// A view of `storage` (internal: ops build tensors this way).
    pub(crate) fn from_parts(storage: Arc<Storage>, layout: Layout, dtype: DType) -> Tensor {
        Tensor(Arc::new(TensorInner {
            layout,
            dtype,
            storage,
            attachment: None,
            host_u32: None,
        }))
    }

    /// The same view with `attachment` (replacing any).
    pub(crate) fn with_attachment(&self, attachment: Option<Attachment>) -> Tensor {
        Tensor(Arc::new(TensorInner {
            layout: self.0.layout.clone(),
            dtype: self.0.dtype,
            storage: self.0.storage.clone(),
            attachment,
            host_u32: self.0.host_u32.clone(),
        }))
    }

    pub(crate) fn attachment(&self) -> Option<&Attachment> {
        self.0.attachment.as_ref()
    }

    pub(crate) fn with_host_u32(&self, host: Arc<[u32]>) -> Tensor {
        Tensor(Arc::new(TensorInner {
            layout: self.0.layout.clone(),
            dtype: self.0.dtype,
            storage: self.0.storage.clone(),
            attachment: self.0.attachment.clone(),
            host_u32: Some(host),
        }))
    }

    pub(crate) fn host_u32(&self) -> Option<&Arc<[u32]>> {
        self.0.host_u32.as_ref()
    }

    /// A contiguous tensor with uninitialized contents (a pooled buffer is not zeroed).
    pub(crate) fn uninit(
        device: &Device,
        shape: &[usize],
        dtype: DType,
        op: &'static str,
    ) -> Result<Tensor> {
        let numel: usize = shape.iter().product();
        let bytes = (numel * dtype.size()) as u64;
        let storage = device.alloc(
            &|| format!("{op}: output of shape {shape:?} ({dtype:?})"),
            bytes,
        )?;
        Ok(Tensor::from_parts(
            storage,
            Layout::contiguous(shape),
            dtype,
        ))
    }

    /// `uninit` with rows `row_stride` elements apart (>= the last dim): (..., V) over a
    /// (..., row_stride) buffer whose padding columns are never written, so that rows start on
    /// aligned boundaries for the kernels that read them.
    pub(crate) fn uninit_rows(
        device: &Device,
        shape: &[usize],
        row_stride: usize,
        dtype: DType,
        op: &'static str,
    ) -> Result<Tensor> {
        let r = shape.len();
        if r < 2 || row_stride <= shape[r - 1] {
            return Tensor::uninit(device, shape, dtype, op);
        }
        let mut padded = shape.to_vec();
        padded[r - 1] = row_stride;
        let t = Tensor::uninit(device, &padded, dtype, op)?;
        Ok(t.with_layout(Layout {
            shape: shape.to_vec(),
            strides: t.strides().to_vec(),
            offset: 0,
        }))
    }

    /// A new view over the same storage, without an attachment (views made by ops get theirs
    /// from the autograd layer).
    pub(crate) fn with_layout(&self, layout: Layout) -> Tensor {
        // A reshape of a whole index tensor keeps its host copy (same elements, same order).
        let host =
            self.0.host_u32.as_ref().filter(|h| {
                layout.offset == 0 && layout.is_contiguous() && layout.numel() == h.len()
            });
        let t = Tensor::from_parts(self.0.storage.clone(), layout, self.0.dtype);
        match host {
            Some(h) => t.with_host_u32(h.clone()),
            None => t,
        }
    }

    pub fn shape(&self) -> &[usize] {
        &self.0.layout.shape
    }

    pub fn strides(&self) -> &[usize] {
        &self.0.layout.strides
    }

    pub fn layout(&self) -> &Layout {
        &self.0.layout
    }

    pub fn dtype(&self) -> DType {
        self.0.dtype
    }

    pub fn rank(&self) -> usize {
        self.0.layout.rank()
    }

    pub fn numel(&self) -> usize {
        self.0.layout.numel()
    }

    pub fn dims(&self) -> &[usize] {
        self.shape()
    }

    pub fn is_contiguous(&self) -> bool {
        self.0.layout.is_contiguous()
    }

    pub fn device(&self) -> &Device {
        self.0.storage.device()
    }

    pub fn storage(&self) -> &Storage {
        &self.0.storage
    }

    /// Whether this handle is the only one to its storage (no clone of it, no other view):
    /// nothing else can read the buffer later, so work recorded from now on may overwrite it
    /// (the queue runs recorded work in order).
    pub(crate) fn is_sole_view(&self) -> bool {
        Arc::strong_count(&self.0) == 1 && Arc::strong_count(&self.0.storage) == 1
    }

    /// Whether two tensors share storage (views of one buffer).
    pub fn same_storage(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.0.storage, &other.0.storage)
    }

    pub(crate) fn expect_dtype(&self, op: &'static str, dtype: DType) -> Result<()> {
        if self.dtype() != dtype {
            return Err(Error::DTypeMismatch {
                op,
                expected: dtype,
                got: self.dtype(),
            });
        }
        Ok(())
    }

    pub(crate) fn expect_same_device(&self, op: &'static str, other: &Tensor) -> Result<()> {
        if !self.device().same(other.device()) {
            return Err(Error::DeviceMismatch { op });
        }
        Ok(())
    }
}
