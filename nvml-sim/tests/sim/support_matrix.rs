//! What each model answers NOT_SUPPORTED for, checked on one scenario holding one GPU of every
//! preset: fans, encoder, NVLink, MIG, ECC, row remapping vs page retirement, memory temperature,
//! driver model, GSP firmware, host vGPU mode and what NVLinks end at.

use crate::common::{self, Session};
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError, RetirementCause};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings as b;

const MODELS: [&str; 5] = [
    "H100-SXM5-80GB",
    "A100-SXM4-80GB",
    "L4",
    "RTX6000-Ada",
    "V100-SXM2-32GB",
];

fn session() -> Session {
    static PATH: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    let path = PATH.get_or_init(|| {
        let mut text = String::new();
        for (i, m) in MODELS.iter().enumerate() {
            text += &format!(
                "[[gpu]]\nmodel = \"{m}\"\nuuid = \"GPU-{i}\"\npci_bus_id = \"{:02x}:00.0\"\nserial = \"{i}\"\n",
                i + 1
            );
        }
        let p = std::env::temp_dir().join(format!("nvml-sim-matrix-{}.toml", std::process::id()));
        std::fs::write(&p, text).unwrap();
        p
    });
    common::session(&[
        ("NVML_SIM_SCENARIO", Some(path.to_str().unwrap())),
        ("NVML_SIM_TIME", Some("10")),
        ("NVML_SIM_START", None),
    ])
}

fn gpu<'n>(nvml: &'n Nvml, model: &str) -> Device<'n> {
    let i = MODELS.iter().position(|m| *m == model).unwrap();
    nvml.device_by_index(i as u32).unwrap()
}

fn unsupported<T: std::fmt::Debug>(r: Result<T, NvmlError>) -> bool {
    matches!(r, Err(NvmlError::NotSupported))
}

fn remapped_rows(d: &Device) -> u32 {
    let (mut a, mut b_, mut c, mut e) = (0, 0, 0, 0);
    // SAFETY: valid handle and out-pointers.
    unsafe {
        d.nvml()
            .lib()
            .nvmlDeviceGetRemappedRows(d.handle(), &mut a, &mut b_, &mut c, &mut e)
    }
}

fn memory_temp(d: &Device) -> u32 {
    // SAFETY: plain C struct; valid handle and a one-entry array.
    unsafe {
        let mut v: b::nvmlFieldValue_t = std::mem::zeroed();
        v.fieldId = b::field_id::NVML_FI_DEV_MEMORY_TEMP;
        assert_eq!(
            d.nvml()
                .lib()
                .nvmlDeviceGetFieldValues(d.handle(), 1, &mut v),
            0
        );
        v.nvmlReturn
    }
}

#[test]
fn names_and_architectures() {
    let nvml = session();
    let names: Vec<_> = MODELS
        .iter()
        .map(|m| gpu(&nvml, m).name().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "NVIDIA H100 80GB HBM3",
            "NVIDIA A100-SXM4-80GB",
            "NVIDIA L4",
            "NVIDIA RTX 6000 Ada Generation",
            "Tesla V100-SXM2-32GB"
        ]
    );
    assert_eq!(
        gpu(&nvml, "L4").memory_info().unwrap().total,
        23034 * 1024 * 1024
    );
    assert_eq!(
        gpu(&nvml, "A100-SXM4-80GB").enforced_power_limit().unwrap(),
        400_000
    );
    assert_eq!(gpu(&nvml, "L4").enforced_power_limit().unwrap(), 72_000);
}

#[test]
fn fans_only_on_the_blower_card() {
    let nvml = session();
    for m in ["H100-SXM5-80GB", "A100-SXM4-80GB", "L4", "V100-SXM2-32GB"] {
        assert_eq!(gpu(&nvml, m).num_fans().unwrap(), 0, "{m}");
        assert!(unsupported(gpu(&nvml, m).fan_speed(0)), "{m}");
    }
    let rtx = gpu(&nvml, "RTX6000-Ada");
    assert_eq!(rtx.num_fans().unwrap(), 1);
    let speed = rtx.fan_speed(0).unwrap();
    assert!((30..=100).contains(&speed), "{speed}");
    assert!(matches!(rtx.fan_speed(1), Err(NvmlError::InvalidArg)));
}

#[test]
fn encoder_nvlink_and_mig() {
    let nvml = session();
    // No NVENC on H100/A100, but the query answers 0 % rather than NOT_SUPPORTED.
    assert_eq!(
        gpu(&nvml, "H100-SXM5-80GB")
            .encoder_utilization()
            .unwrap()
            .utilization,
        0
    );
    assert_eq!(
        gpu(&nvml, "A100-SXM4-80GB")
            .encoder_utilization()
            .unwrap()
            .utilization,
        0
    );
    assert!(gpu(&nvml, "L4").encoder_utilization().is_ok());
    assert!(gpu(&nvml, "RTX6000-Ada").encoder_utilization().is_ok());

    assert!(unsupported(
        gpu(&nvml, "L4").link_wrapper_for(0).is_active()
    ));
    assert!(unsupported(
        gpu(&nvml, "RTX6000-Ada").link_wrapper_for(0).is_active()
    ));
    assert!(
        gpu(&nvml, "A100-SXM4-80GB")
            .link_wrapper_for(11)
            .is_active()
            .unwrap()
    );

    assert!(gpu(&nvml, "H100-SXM5-80GB").mig_mode().is_ok());
    assert!(gpu(&nvml, "A100-SXM4-80GB").mig_mode().is_ok());
    assert!(unsupported(gpu(&nvml, "L4").mig_mode()));
}

#[test]
fn remapping_from_ampere_retirement_before() {
    let nvml = session();
    let ok = b::nvmlReturn_enum_NVML_SUCCESS;
    let ns = b::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
    assert_eq!(remapped_rows(&gpu(&nvml, "H100-SXM5-80GB")), ok);
    assert_eq!(remapped_rows(&gpu(&nvml, "A100-SXM4-80GB")), ok);
    assert_eq!(remapped_rows(&gpu(&nvml, "L4")), ok);
    assert_eq!(remapped_rows(&gpu(&nvml, "V100-SXM2-32GB")), ns);
    let cause = RetirementCause::MultipleSingleBitEccErrors;
    assert!(unsupported(
        gpu(&nvml, "A100-SXM4-80GB").retired_pages(cause)
    ));
    assert!(
        gpu(&nvml, "V100-SXM2-32GB")
            .retired_pages(cause)
            .unwrap()
            .is_empty()
    );
}

#[test]
fn ecc_off_on_the_workstation_card_and_hbm_sensor_only_on_hbm() {
    let nvml = session();
    let ecc = |m| gpu(&nvml, m).total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile);
    assert!(unsupported(ecc("RTX6000-Ada")));
    assert_eq!(ecc("L4").unwrap(), 0);
    assert_eq!(memory_temp(&gpu(&nvml, "H100-SXM5-80GB")), 0);
    assert_eq!(
        memory_temp(&gpu(&nvml, "L4")),
        b::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED
    );
}

/// (return code, is enabled, default mode) of nvmlDeviceGetGspFirmwareMode.
fn gsp_mode(d: &Device) -> (b::nvmlReturn_t, u32, u32) {
    let (mut on, mut default) = (u32::MAX, u32::MAX);
    // SAFETY: valid handle and out-pointers.
    let r = unsafe {
        d.nvml()
            .lib()
            .nvmlDeviceGetGspFirmwareMode(d.handle(), &mut on, &mut default)
    };
    (r, on, default)
}

/// nvmlDeviceGetGspFirmwareVersion: the return code and the string.
fn gsp_version(d: &Device) -> (b::nvmlReturn_t, String) {
    let mut buf = [0 as std::os::raw::c_char; b::NVML_GSP_FIRMWARE_VERSION_BUF_SIZE as usize];
    // SAFETY: valid handle; the buffer has the size nvml.h asks for.
    let r = unsafe {
        d.nvml()
            .lib()
            .nvmlDeviceGetGspFirmwareVersion(d.handle(), buf.as_mut_ptr())
    };
    // SAFETY: the buffer was zeroed and the call writes a NUL-terminated string.
    let s = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    (r, s.to_string_lossy().into_owned())
}

/// nvmlDeviceGetNvLinkRemoteDeviceType: the return code and the type.
fn remote_type(d: &Device, link: u32) -> (b::nvmlReturn_t, u32) {
    let mut t = u32::MAX;
    // SAFETY: valid handle and out-pointer.
    let r = unsafe {
        d.nvml()
            .lib()
            .nvmlDeviceGetNvLinkRemoteDeviceType(d.handle(), link, &mut t)
    };
    (r, t)
}

#[test]
fn driver_model_and_host_vgpu_mode_are_windows_and_vgpu_host_notions() {
    let nvml = session();
    let ns = b::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
    for m in MODELS {
        let d = gpu(&nvml, m);
        let (mut current, mut pending, mut vgpu) = (0, 0, 0);
        // SAFETY: valid handle and out-pointers.
        unsafe {
            let lib = nvml.lib();
            assert_eq!(
                lib.nvmlDeviceGetDriverModel(d.handle(), &mut current, &mut pending),
                ns,
                "{m}"
            );
            assert_eq!(
                lib.nvmlDeviceGetHostVgpuMode(d.handle(), &mut vgpu),
                ns,
                "{m}"
            );
        }
    }
}

#[test]
fn gsp_firmware_on_data_center_boards_from_turing() {
    let nvml = session();
    let ok = b::nvmlReturn_enum_NVML_SUCCESS;
    let ns = b::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
    for m in ["H100-SXM5-80GB", "A100-SXM4-80GB", "L4"] {
        assert_eq!(gsp_mode(&gpu(&nvml, m)), (ok, 1, 1), "{m}");
        // The firmware ships with the driver: its version is the driver's.
        assert_eq!(
            gsp_version(&gpu(&nvml, m)),
            (ok, nvml.sys_driver_version().unwrap()),
            "{m}"
        );
    }
    assert_eq!(gsp_mode(&gpu(&nvml, "RTX6000-Ada")), (ok, 0, 0));
    assert_eq!(gsp_version(&gpu(&nvml, "RTX6000-Ada")).0, ns);
    assert_eq!(gsp_mode(&gpu(&nvml, "V100-SXM2-32GB")).0, ns);
    assert_eq!(gsp_version(&gpu(&nvml, "V100-SXM2-32GB")).0, ns);
}

#[test]
fn nvlinks_end_at_nvswitches_on_hgx_and_at_gpus_on_volta() {
    let nvml = session();
    let ok = b::nvmlReturn_enum_NVML_SUCCESS;
    let switch = b::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_SWITCH;
    let gpu_end = b::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_GPU;
    let h100 = gpu(&nvml, "H100-SXM5-80GB");
    assert_eq!(remote_type(&h100, 0), (ok, switch));
    assert_eq!(remote_type(&h100, 17), (ok, switch));
    assert_eq!(
        remote_type(&h100, 18).0,
        b::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT
    );
    assert_eq!(remote_type(&gpu(&nvml, "A100-SXM4-80GB"), 11), (ok, switch));
    assert_eq!(remote_type(&gpu(&nvml, "V100-SXM2-32GB"), 5), (ok, gpu_end));
    for m in ["L4", "RTX6000-Ada"] {
        assert_eq!(
            remote_type(&gpu(&nvml, m), 0).0,
            b::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED,
            "{m}"
        );
    }
}
