//! Tensors from host data, constants and seeded random draws; reading tensors back.

use crate::error::{Error, Result};
use crate::graph::{DType, Device, Tensor};
use crate::kernels::elementwise::{self, ElementwiseParams};
use crate::kernels::pack8;
use crate::kernels::random::{self, Distribution, RandomParams};

fn check_len(op: &'static str, shape: &[usize], got: usize) -> Result<()> {
    let expected: usize = shape.iter().product();
    if expected != got {
        return Err(Error::ElementCount {
            op,
            shape: shape.to_vec(),
            expected,
            got,
        });
    }
    Ok(())
}

impl Tensor {
    /// An f32 tensor holding `data` (row-major) with shape `shape`.
    pub fn from_slice(device: &Device, data: &[f32], shape: &[usize]) -> Result<Tensor> {
        check_len("from_slice", shape, data.len())?;
        let t = Tensor::uninit(device, shape, DType::F32, "from_slice")?;
        device.upload(t.storage(), 0, bytemuck::cast_slice(data));
        Ok(t)
    }

    /// A tensor of element type `dtype` (f32 or f16: converted on the host) holding `data`.
    pub fn from_slice_as(
        device: &Device,
        data: &[f32],
        shape: &[usize],
        dtype: DType,
    ) -> Result<Tensor> {
        match dtype {
            DType::F32 => Tensor::from_slice(device, data, shape),
            DType::F16 => {
                check_len("from_slice_as", shape, data.len())?;
                let t = Tensor::uninit(device, shape, DType::F16, "from_slice_as")?;
                let halves: Vec<half::f16> = data.iter().map(|&x| half::f16::from_f32(x)).collect();
                device.upload(t.storage(), 0, bytemuck::cast_slice(&halves));
                Ok(t)
            }
            DType::U32 => Err(Error::DTypeMismatch {
                op: "from_slice_as",
                expected: DType::F32,
                got: DType::U32,
            }),
        }
    }

    /// A u32 tensor (token ids, gather indices).
    pub fn from_u32(device: &Device, data: &[u32], shape: &[usize]) -> Result<Tensor> {
        check_len("from_u32", shape, data.len())?;
        let t = Tensor::uninit(device, shape, DType::U32, "from_u32")?;
        device.upload(t.storage(), 0, bytemuck::cast_slice(data));
        Ok(t.with_host_u32(data.into()))
    }

    /// An f32 tensor filled with `value`.
    pub fn full(device: &Device, shape: &[usize], value: f32) -> Result<Tensor> {
        let t = Tensor::uninit(device, shape, DType::F32, "full")?;
        let numel = t.numel();
        if numel == 0 {
            return Ok(t);
        }
        let vec4 = numel % 4 == 0;
        let n = if vec4 { numel / 4 } else { numel } as u64;
        let params = ElementwiseParams {
            numel: n as u32,
            rank: 1,
            scalar: value,
            shape: pack8(&[n as usize]),
            out_strides: pack8(&[1]),
            ..Default::default()
        };
        let groups = device.grid(n.div_ceil(elementwise::WORKGROUP));
        device.record(
            &elementwise::FILL,
            &elementwise::spec(0, vec4, false),
            &params,
            &[t.storage()],
            groups,
        );
        Ok(t)
    }

    /// Overwrites this contiguous view with host data (in order with recorded work).
    pub fn copy_from_slice(&self, data: &[f32]) -> Result<()> {
        self.expect_dtype("copy_from_slice", DType::F32)?;
        check_len("copy_from_slice", self.shape(), data.len())?;
        if !self.is_contiguous() {
            return Err(Error::InvalidArgument {
                op: "copy_from_slice",
                reason: format!("the target view {:?} is not contiguous", self.shape()),
            });
        }
        self.device().upload(
            self.storage(),
            self.layout().offset as u64 * 4,
            bytemuck::cast_slice(data),
        );
        Ok(())
    }

    /// Overwrites this contiguous view with normal draws (in place, one dispatch).
    pub fn fill_normal_(&self, mean: f32, std: f32, seed: u64) -> Result<()> {
        self.fill_normal_at_(mean, std, seed, 0)
    }

    /// `fill_normal_` with the draws of elements `first ..` of `seed`'s sequence: the pieces
    /// of a tensor filled one by one (its row shards) hold what one fill of it would.
    pub fn fill_normal_at_(&self, mean: f32, std: f32, seed: u64, first: usize) -> Result<()> {
        self.expect_dtype("fill_normal_", DType::F32)?;
        if !self.is_contiguous() {
            return Err(Error::InvalidArgument {
                op: "fill_normal_",
                reason: format!("the target view {:?} is not contiguous", self.shape()),
            });
        }
        // The kernel's counter is a u32.
        if first + self.numel() > 1 << 32 {
            return Err(Error::InvalidArgument {
                op: "fill_normal_",
                reason: format!(
                    "draws {first} .. {} are past the 2^32 a seed's sequence holds",
                    first + self.numel()
                ),
            });
        }
        self.draw_(Distribution::Normal, mean, std, seed, first as u32);
        Ok(())
    }

    /// Overwrites every element of this view with `value` (in order with recorded work).
    pub fn fill_(&self, value: f32) -> Result<()> {
        self.expect_dtype("fill", DType::F32)?;
        let numel = self.numel();
        if numel == 0 {
            return Ok(());
        }
        let l = self.layout().coalesced();
        let params = ElementwiseParams {
            numel: numel as u32,
            rank: l.rank() as u32,
            scalar: value,
            shape: pack8(&l.shape),
            out_strides: pack8(&l.strides),
            offsets: [0, 0, 0, l.offset as u32],
            ..Default::default()
        };
        let device = self.device();
        let groups = device.grid((numel as u64).div_ceil(elementwise::WORKGROUP));
        device.record(
            &elementwise::FILL,
            &elementwise::spec(0, false, false),
            &params,
            &[self.storage()],
            groups,
        );
        Ok(())
    }

    pub fn zeros(device: &Device, shape: &[usize]) -> Result<Tensor> {
        Tensor::full(device, shape, 0.0)
    }

    pub fn ones(device: &Device, shape: &[usize]) -> Result<Tensor> {
        Tensor::full(device, shape, 1.0)
    }

    /// Uniform draws in [lo, hi), a pure function of (seed, element index).
    pub fn rand_uniform(
        device: &Device,
        shape: &[usize],
        lo: f32,
        hi: f32,
        seed: u64,
    ) -> Result<Tensor> {
        Tensor::random(device, shape, Distribution::Uniform, lo, hi, seed)
    }

    /// Normal draws with mean `mean` and standard deviation `std`.
    pub fn rand_normal(
        device: &Device,
        shape: &[usize],
        mean: f32,
        std: f32,
        seed: u64,
    ) -> Result<Tensor> {
        Tensor::random(device, shape, Distribution::Normal, mean, std, seed)
    }

    /// Overwrites this contiguous f32 view with draws from `dist` (parameters a, b): element i
    /// of the view is a pure function of (seed, first + i).
    fn draw_(&self, dist: Distribution, a: f32, b: f32, seed: u64, first: u32) {
        let numel = self.numel() as u64;
        let params = RandomParams {
            numel: numel as u32,
            seed_lo: seed as u32,
            seed_hi: (seed >> 32) as u32,
            counter: first,
            a,
            b,
            out_offset: self.layout().offset as u32,
            _pad: 0,
        };
        let dev = self.device();
        let groups = dev.grid(numel.div_ceil(random::WORKGROUP));
        dev.record(
            &random::RANDOM,
            &random::spec(dist),
            &params,
            &[self.storage()],
            groups,
        );
    }

    fn random(
        device: &Device,
        shape: &[usize],
        dist: Distribution,
        a: f32,
        b: f32,
        seed: u64,
    ) -> Result<Tensor> {
        let t = Tensor::uninit(device, shape, DType::F32, "random")?;
        t.draw_(dist, a, b, seed, 0);
        Ok(t)
    }

    /// Flushes, waits for the GPU and returns the elements in row-major order.
    /// An f16 tensor's elements come back converted to f32.
    pub fn to_vec(&self) -> Result<Vec<f32>> {
        if self.dtype() == DType::F16 {
            let halves: Vec<half::f16> = bytemuck::pod_collect_to_vec(&self.read_bytes()?);
            return Ok(halves.iter().map(|h| h.to_f32()).collect());
        }
        self.expect_dtype("to_vec", DType::F32)?;
        Ok(bytemuck::pod_collect_to_vec(&self.read_bytes()?))
    }

    pub fn to_vec_u32(&self) -> Result<Vec<u32>> {
        self.expect_dtype("to_vec_u32", DType::U32)?;
        Ok(bytemuck::pod_collect_to_vec(&self.read_bytes()?))
    }

    /// The value of a one-element tensor.
    pub fn item(&self) -> Result<f32> {
        if self.numel() != 1 {
            return Err(Error::ShapeMismatch {
                op: "item",
                expected: "a tensor of one element".into(),
                got: self.shape().to_vec(),
            });
        }
        Ok(self.to_vec()?[0])
    }

    fn read_bytes(&self) -> Result<Vec<u8>> {
        let t = self.contiguous()?;
        let size = t.dtype().size() as u64;
        t.device().read_back(
            t.storage(),
            t.layout().offset as u64 * size,
            t.numel() as u64 * size,
        )
    }
}
