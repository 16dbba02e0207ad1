//! NVML return codes: names for scenario files and the strings `nvmlErrorString` answers.

use std::ffi::CStr;

/// (code, name without the `NVML_ERROR_` prefix, description). The descriptions follow the real
/// library's wording so tools that print them read naturally.
const CODES: &[(u32, &str, &CStr)] = &[
    (0, "SUCCESS", c"Success"),
    (1, "UNINITIALIZED", c"Uninitialized"),
    (2, "INVALID_ARGUMENT", c"Invalid Argument"),
    (3, "NOT_SUPPORTED", c"Not Supported"),
    (4, "NO_PERMISSION", c"Insufficient Permissions"),
    (5, "ALREADY_INITIALIZED", c"Already Initialized"),
    (6, "NOT_FOUND", c"Not Found"),
    (7, "INSUFFICIENT_SIZE", c"Insufficient Size"),
    (8, "INSUFFICIENT_POWER", c"Insufficient External Power"),
    (9, "DRIVER_NOT_LOADED", c"Driver Not Loaded"),
    (10, "TIMEOUT", c"Timeout"),
    (11, "IRQ_ISSUE", c"Interrupt request issue"),
    (12, "LIBRARY_NOT_FOUND", c"NVML Shared Library Not Found"),
    (13, "FUNCTION_NOT_FOUND", c"Function Not Found"),
    (14, "CORRUPTED_INFOROM", c"Corrupted infoROM"),
    (15, "GPU_IS_LOST", c"GPU is lost"),
    (16, "RESET_REQUIRED", c"GPU requires restart"),
    (
        17,
        "OPERATING_SYSTEM",
        c"The operating system has blocked the request.",
    ),
    (
        18,
        "LIB_RM_VERSION_MISMATCH",
        c"RM has detected an NVML/RM version mismatch.",
    ),
    (19, "IN_USE", c"In use by another client"),
    (20, "MEMORY", c"Insufficient Memory"),
    (21, "NO_DATA", c"No data"),
    (
        22,
        "VGPU_ECC_NOT_SUPPORTED",
        c"ECC is not supported for vGPU",
    ),
    (23, "INSUFFICIENT_RESOURCES", c"Insufficient resources"),
    (24, "FREQ_NOT_SUPPORTED", c"Frequency not supported"),
    (
        25,
        "ARGUMENT_VERSION_MISMATCH",
        c"Argument version mismatch",
    ),
    (26, "DEPRECATED", c"Deprecated"),
    (27, "NOT_READY", c"Not ready"),
    (28, "GPU_NOT_FOUND", c"GPU not found"),
    (29, "INVALID_STATE", c"Invalid state"),
    (999, "UNKNOWN", c"Unknown Error"),
];

/// The code for a name such as "GPU_IS_LOST" or "NVML_ERROR_GPU_IS_LOST" (case-insensitive).
pub fn code_from_name(name: &str) -> Option<u32> {
    let upper = name.trim().to_ascii_uppercase();
    let short = upper.strip_prefix("NVML_ERROR_").unwrap_or(&upper);
    CODES
        .iter()
        .find(|(_, n, _)| *n == short)
        .map(|(c, _, _)| *c)
}

/// The static description of a code (what `nvmlErrorString` returns).
pub fn description(code: u32) -> &'static CStr {
    CODES
        .iter()
        .find(|(c, _, _)| *c == code)
        .map(|(_, _, d)| *d)
        .unwrap_or(c"Unknown Error")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_descriptions() {
        assert_eq!(code_from_name("gpu_is_lost"), Some(15));
        assert_eq!(code_from_name("NVML_ERROR_TIMEOUT"), Some(10));
        assert_eq!(code_from_name("bogus"), None);
        assert_eq!(description(15), c"GPU is lost");
        assert_eq!(description(12345), c"Unknown Error");
    }
}
