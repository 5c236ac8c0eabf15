//! Reading the files a command names: `-` is standard input (`iptables-save | vallumctl apply
//! host -`), as iptables-restore, ipset restore and most Unix tools read it.

use std::io::Read as _;
use std::path::{Path, PathBuf};

use crate::error::CliError;

/// The file name that means standard input.
pub const STDIN: &str = "-";

/// Whether `path` is `-` (standard input).
pub fn is_stdin(path: &Path) -> bool {
    path == Path::new(STDIN)
}

/// The name messages use for `path`: `<stdin>` for `-`, else the path.
pub fn display_name(path: &Path) -> String {
    if is_stdin(path) {
        "<stdin>".to_owned()
    } else {
        path.display().to_string()
    }
}

/// Default `--max-file-bytes`: 64 MiB, the largest answer vallumctl takes (vallumd's own
/// `--max-request-bytes` is 4 MiB unless raised).
pub const DEFAULT_MAX_FILE_BYTES: u64 = 64 << 20;

/// `--max-file-bytes`, set once by `main` before any file is read.
static MAX_FILE_BYTES: std::sync::OnceLock<u64> = std::sync::OnceLock::new();

/// Sets the largest file [`read_text`] reads (`--max-file-bytes`); the first call wins.
pub fn set_max_file_bytes(n: u64) {
    let _ = MAX_FILE_BYTES.set(n);
}

/// The text of `path`, or of standard input for `-`, at most `--max-file-bytes`
/// ([`DEFAULT_MAX_FILE_BYTES`]) long: a regular file is refused by its size before a byte of
/// it is read, standard input (or a pipe) once one byte more than the limit arrived, so the
/// memory it takes is bounded by the limit. Too large: [`CliError::TooLarge`]; not UTF-8, or
/// unreadable: [`CliError::Read`] (exit 1 each).
pub fn read_text(path: &Path) -> Result<String, CliError> {
    let limit = *MAX_FILE_BYTES.get().unwrap_or(&DEFAULT_MAX_FILE_BYTES);
    let name = PathBuf::from(display_name(path));
    let read_err = |source| CliError::Read {
        path: name.clone(),
        source,
    };
    let too_large = |size| CliError::TooLarge {
        path: name.clone(),
        size,
        limit,
    };
    let mut bytes = Vec::new();
    if is_stdin(path) {
        std::io::stdin()
            .lock()
            .take(limit.saturating_add(1))
            .read_to_end(&mut bytes)
            .map_err(read_err)?;
    } else {
        let file = std::fs::File::open(path).map_err(read_err)?;
        let meta = file.metadata().map_err(read_err)?;
        if meta.is_file() && meta.len() > limit {
            return Err(too_large(Some(meta.len())));
        }
        file.take(limit.saturating_add(1))
            .read_to_end(&mut bytes)
            .map_err(read_err)?;
    }
    if bytes.len() as u64 > limit {
        return Err(too_large(None));
    }
    String::from_utf8(bytes)
        .map_err(|e| read_err(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))
}

/// Checks, before any call, that `path` (not standard input) can be opened and is no larger
/// than `--max-file-bytes`: the size and readability of an input are decided by the file
/// alone, whether or not the server is up. [`CliError::Read`] or [`CliError::TooLarge`].
pub fn check_size(path: &Path) -> Result<(), CliError> {
    if is_stdin(path) {
        return Ok(());
    }
    let limit = *MAX_FILE_BYTES.get().unwrap_or(&DEFAULT_MAX_FILE_BYTES);
    let read_err = |source| CliError::Read {
        path: path.to_owned(),
        source,
    };
    let meta = std::fs::File::open(path)
        .and_then(|f| f.metadata())
        .map_err(read_err)?;
    if meta.is_file() && meta.len() > limit {
        return Err(CliError::TooLarge {
            path: path.to_owned(),
            size: Some(meta.len()),
            limit,
        });
    }
    Ok(())
}

/// Attaches the local file to a status so its violations print as `FILE:LINE:COL` (`<stdin>`
/// for `-`).
pub fn with_file(file: &Path) -> impl FnOnce(tonic::Status) -> CliError + '_ {
    move |status| CliError::Status {
        status,
        file: Some(PathBuf::from(display_name(file))),
    }
}
