//! A Vulkan buffer whose memory another API can map: made through wgpu-hal's Vulkan device
//! with `VK_KHR_external_memory_fd` (one dedicated device-local allocation, exported as an
//! opaque file descriptor), handed to wgpu as a buffer its kernels bind like any other.
//! NCCL's reduction keeps a chunk's gradients there and imports the descriptor into CUDA.

use ash::vk;
use wgpu::hal::api::Vulkan;

use crate::error::{Error, Result};
use crate::graph::Device;

/// The exported buffer: wgpu's handle (the memory is freed with it) and the descriptor CUDA
/// imports.
pub struct ExportedBuffer {
    pub buffer: wgpu::Buffer,
    /// An opaque file descriptor of the memory (owned: CUDA's import takes it).
    pub fd: i32,
    /// Bytes of the allocation (at least the buffer's).
    pub allocation_size: u64,
}

fn vk_error(what: &str, e: vk::Result) -> Error {
    Error::Device(format!(
        "exporting the gradient bucket: {what} failed ({e})"
    ))
}

/// The UUID of `device`'s physical device (what CUDA's `cuDeviceGetUuid` gives for the same
/// GPU), or None when the adapter is not a Vulkan one.
pub fn device_uuid(device: &Device) -> Option<[u8; 16]> {
    // SAFETY: the hal device is only read from, while `device` is alive.
    let hal = unsafe { device.gpu().device.as_hal::<Vulkan>() }?;
    let instance = hal.shared_instance().raw_instance();
    let mut id = vk::PhysicalDeviceIDProperties::default();
    let mut props = vk::PhysicalDeviceProperties2::default().push_next(&mut id);
    // SAFETY: a valid physical device of this instance; Vulkan 1.1 (wgpu's minimum).
    unsafe { instance.get_physical_device_properties2(hal.raw_physical_device(), &mut props) };
    Some(id.device_uuid)
}

/// Whether `device` is a Vulkan device with `VK_KHR_external_memory_fd` enabled.
pub fn can_export(device: &Device) -> bool {
    // SAFETY: only the enabled extensions are read.
    unsafe { device.gpu().device.as_hal::<Vulkan>() }.is_some_and(|hal| {
        hal.enabled_device_extensions()
            .contains(&ash::khr::external_memory_fd::NAME)
    })
}

/// A device-local buffer of `size` bytes (STORAGE, COPY_SRC and COPY_DST) on `device`, its
/// memory exported as an opaque file descriptor.
pub fn export_buffer(device: &Device, size: u64) -> Result<ExportedBuffer> {
    if !can_export(device) {
        return Err(Error::Device(format!(
            "adapter {} cannot export memory (not Vulkan, or no VK_KHR_external_memory_fd)",
            device.gpu().info.name
        )));
    }
    let wgpu_device = &device.gpu().device;
    // SAFETY: the hal device outlives every handle made here: the buffer and its memory are
    // handed to wgpu (which frees them) before the guard is dropped, or destroyed on error.
    let hal = unsafe { wgpu_device.as_hal::<Vulkan>() }
        .ok_or_else(|| Error::Device("the adapter is not a Vulkan one".into()))?;
    let raw = hal.raw_device();
    let instance = hal.shared_instance().raw_instance();
    let handle_type = vk::ExternalMemoryHandleTypeFlags::OPAQUE_FD;
    let mut external = vk::ExternalMemoryBufferCreateInfo::default().handle_types(handle_type);
    let info = vk::BufferCreateInfo::default()
        .size(size)
        .usage(
            vk::BufferUsageFlags::TRANSFER_SRC
                | vk::BufferUsageFlags::TRANSFER_DST
                | vk::BufferUsageFlags::STORAGE_BUFFER,
        )
        .sharing_mode(vk::SharingMode::EXCLUSIVE)
        .push_next(&mut external);
    // SAFETY: a valid create info on a live device.
    let buffer =
        unsafe { raw.create_buffer(&info, None) }.map_err(|e| vk_error("vkCreateBuffer", e))?;
    let destroy_buffer = || unsafe { raw.destroy_buffer(buffer, None) };
    // SAFETY: `buffer` was made on `raw`.
    let needs = unsafe { raw.get_buffer_memory_requirements(buffer) };
    // SAFETY: a physical device of this instance.
    let types =
        unsafe { instance.get_physical_device_memory_properties(hal.raw_physical_device()) };
    let Some(type_index) = (0..types.memory_type_count).find(|&i| {
        needs.memory_type_bits & (1 << i) != 0
            && types.memory_types[i as usize]
                .property_flags
                .contains(vk::MemoryPropertyFlags::DEVICE_LOCAL)
    }) else {
        destroy_buffer();
        return Err(Error::Device(
            "exporting the gradient bucket: no device-local memory type takes the buffer".into(),
        ));
    };
    let mut export = vk::ExportMemoryAllocateInfo::default().handle_types(handle_type);
    let mut dedicated = vk::MemoryDedicatedAllocateInfo::default().buffer(buffer);
    let alloc = vk::MemoryAllocateInfo::default()
        .allocation_size(needs.size)
        .memory_type_index(type_index)
        .push_next(&mut export)
        .push_next(&mut dedicated);
    // SAFETY: a valid allocate info on a live device.
    let memory = match unsafe { raw.allocate_memory(&alloc, None) } {
        Ok(m) => m,
        Err(e) => {
            destroy_buffer();
            return Err(vk_error("vkAllocateMemory (exportable)", e));
        }
    };
    let fail = |what: &str, e: vk::Result| {
        // SAFETY: neither handle was handed on.
        unsafe {
            raw.destroy_buffer(buffer, None);
            raw.free_memory(memory, None);
        }
        vk_error(what, e)
    };
    // SAFETY: `memory` is a fresh dedicated allocation for `buffer`.
    if let Err(e) = unsafe { raw.bind_buffer_memory(buffer, memory, 0) } {
        return Err(fail("vkBindBufferMemory", e));
    }
    let fd_fn = ash::khr::external_memory_fd::Device::new(instance, raw);
    let get = vk::MemoryGetFdInfoKHR::default()
        .memory(memory)
        .handle_type(handle_type);
    // SAFETY: `memory` was allocated exportable as an opaque fd.
    let fd = match unsafe { fd_fn.get_memory_fd(&get) } {
        Ok(fd) => fd,
        Err(e) => return Err(fail("vkGetMemoryFdKHR", e)),
    };
    // SAFETY: `buffer` is bound to the whole of `memory`, which wgpu now owns: it destroys
    // both when the wgpu buffer is dropped and the GPU is done with it.
    let hal_buffer =
        unsafe { wgpu::hal::vulkan::Buffer::from_raw_managed(buffer, memory, 0, needs.size) };
    drop(hal);
    let desc = wgpu::BufferDescriptor {
        label: Some("wgrad:gradient_bucket"),
        size,
        usage: wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_SRC
            | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    };
    // SAFETY: made on this device, with the usages `desc` names and the size it says.
    let buffer = unsafe { wgpu_device.create_buffer_from_hal::<Vulkan>(hal_buffer, &desc) };
    Ok(ExportedBuffer {
        buffer,
        fd,
        allocation_size: needs.size,
    })
}
