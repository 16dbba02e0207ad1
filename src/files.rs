//! Reading the small files the exporter is pointed at (the `--config` and `--web-config` files,
//! certificates, keys, the kubelet's token, job mapping files) within a bound, and quoting what
//! they hold in a one-line message. The ground floor: it imports nothing of the exporter's.
//!
//! A path given by a user or a tenant may name a FIFO (whose open waits for a writer), a device
//! such as `/dev/zero` (endless), or a huge file: each is refused without blocking and without
//! reading past the bound.

use std::path::Path;

/// The most a configuration file (`--config`, `--web-config`, a certificate, key or CA file) may
/// hold. Real ones are a few KiB; a CA bundle of every public root is about 200 KiB.
pub const MAX_FILE_BYTES: u64 = 1 << 20;

/// The bytes of a configuration file: a regular file of at most [`MAX_FILE_BYTES`]. Anything else
/// (a FIFO, a device such as `/dev/zero`, a directory, a larger file) is an error that says what
/// the file is, found without reading more than the limit and without waiting for a FIFO's writer.
pub fn read_small_file(path: &Path) -> std::io::Result<Vec<u8>> {
    read_bounded_file(path, MAX_FILE_BYTES)
}

/// The bytes of a regular file of at most `limit` bytes, as [`read_small_file`]: a file that is
/// not regular is an `InvalidInput` error saying what it is, a larger one `InvalidData`.
pub fn read_bounded_file(path: &Path, limit: u64) -> std::io::Result<Vec<u8>> {
    use std::io::{Error, ErrorKind, Read};
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    // Without O_NONBLOCK, opening a FIFO waits for a writer, possibly forever; for a regular file
    // the flag changes nothing.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let meta = file.metadata()?;
    let kind = meta.file_type();
    let what = if kind.is_file() {
        None
    } else if kind.is_dir() {
        Some("a directory")
    } else if kind.is_fifo() {
        Some("a FIFO")
    } else if kind.is_char_device() {
        Some("a character device")
    } else if kind.is_block_device() {
        Some("a block device")
    } else if kind.is_socket() {
        Some("a socket")
    } else {
        Some("not a file")
    };
    if let Some(what) = what {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!("{what}, not a regular file"),
        ));
    }
    let too_big = || {
        Error::new(
            ErrorKind::InvalidData,
            format!("larger than {} KiB", limit / 1024),
        )
    };
    if meta.len() > limit {
        return Err(too_big());
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    // A file that grows while it is read stops one byte past the limit.
    file.take(limit + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(too_big());
    }
    Ok(bytes)
}

/// `msg` with control characters escaped. Messages quote what the user wrote (a value, a key, a
/// file name), and a line break in any of them must not split the one-line error.
pub fn one_line(msg: &str) -> String {
    msg.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_debug().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// For the tests of a generated document: asserts that the checked-in file at `relative` (to the
/// crate's directory) holds `rendered`, or writes it there when `UPDATE_DOCS` is set; `update`
/// is the command that rewrites it, named in the failure.
#[cfg(test)]
pub(crate) fn assert_generated(relative: &str, rendered: &str, update: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(relative);
    if std::env::var_os("UPDATE_DOCS").is_some() {
        std::fs::write(&path, rendered).expect("write the generated document");
        return;
    }
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        on_disk == rendered,
        "{relative} is out of date; run `{update}`"
    );
}
