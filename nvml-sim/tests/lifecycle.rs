//! Init reference counting and UNINITIALIZED answers, calling the exported functions directly
//! (this test binary links the library as an rlib; nothing else in this process touches it).

use nvml_sim::api::metrics::nvmlDeviceGetPowerUsage;
use nvml_sim::api::system::{nvmlDeviceGetCount_v2, nvmlInit_v2, nvmlInitWithFlags, nvmlShutdown};
use nvml_wrapper_sys::bindings as b;

#[test]
fn init_is_reference_counted() {
    // SAFETY: the exported functions are called with valid out-pointers.
    unsafe {
        let mut count = 0;
        assert_eq!(
            nvmlDeviceGetCount_v2(&mut count),
            b::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED
        );
        assert_eq!(nvmlShutdown(), b::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED);
        let mut mw = 0;
        assert_eq!(
            nvmlDeviceGetPowerUsage(std::ptr::null_mut(), &mut mw),
            b::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED
        );

        assert_eq!(nvmlInit_v2(), b::nvmlReturn_enum_NVML_SUCCESS);
        assert_eq!(nvmlInitWithFlags(0), b::nvmlReturn_enum_NVML_SUCCESS);
        assert_eq!(
            nvmlDeviceGetCount_v2(&mut count),
            b::nvmlReturn_enum_NVML_SUCCESS
        );
        assert_eq!(count, 8);
        assert_eq!(
            nvmlDeviceGetCount_v2(std::ptr::null_mut()),
            b::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT
        );

        assert_eq!(nvmlShutdown(), b::nvmlReturn_enum_NVML_SUCCESS);
        // One reference left: still usable.
        assert_eq!(
            nvmlDeviceGetCount_v2(&mut count),
            b::nvmlReturn_enum_NVML_SUCCESS
        );
        assert_eq!(nvmlShutdown(), b::nvmlReturn_enum_NVML_SUCCESS);
        assert_eq!(
            nvmlDeviceGetCount_v2(&mut count),
            b::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED
        );
        assert_eq!(nvmlShutdown(), b::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED);
    }
}
