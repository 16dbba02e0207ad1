//! Init reference counting and UNINITIALIZED answers, calling the library's exported functions
//! directly.

use crate::common;
use nvml_wrapper_sys::bindings::{self as b, NvmlLib};

#[test]
fn init_is_reference_counted() {
    // No other test holds a reference now: the count starts at 0.
    let _turn = common::turn(&[]);
    // SAFETY: loads the simulator, whose initializers have no preconditions; the exported
    // functions are then called with valid out-pointers.
    unsafe {
        let lib = NvmlLib::new(common::lib_path()).expect("load libnvml_sim.so");
        let mut count = 0;
        assert_eq!(
            lib.nvmlDeviceGetCount_v2(&mut count),
            b::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED
        );
        assert_eq!(
            lib.nvmlShutdown(),
            b::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED
        );
        let mut mw = 0;
        assert_eq!(
            lib.nvmlDeviceGetPowerUsage(std::ptr::null_mut(), &mut mw),
            b::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED
        );

        assert_eq!(lib.nvmlInit_v2(), b::nvmlReturn_enum_NVML_SUCCESS);
        assert_eq!(lib.nvmlInitWithFlags(0), b::nvmlReturn_enum_NVML_SUCCESS);
        assert_eq!(
            lib.nvmlDeviceGetCount_v2(&mut count),
            b::nvmlReturn_enum_NVML_SUCCESS
        );
        assert_eq!(count, 8);
        assert_eq!(
            lib.nvmlDeviceGetCount_v2(std::ptr::null_mut()),
            b::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT
        );

        assert_eq!(lib.nvmlShutdown(), b::nvmlReturn_enum_NVML_SUCCESS);
        // One reference left: still usable.
        assert_eq!(
            lib.nvmlDeviceGetCount_v2(&mut count),
            b::nvmlReturn_enum_NVML_SUCCESS
        );
        assert_eq!(lib.nvmlShutdown(), b::nvmlReturn_enum_NVML_SUCCESS);
        assert_eq!(
            lib.nvmlDeviceGetCount_v2(&mut count),
            b::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED
        );
        assert_eq!(
            lib.nvmlShutdown(),
            b::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED
        );
    }
}
