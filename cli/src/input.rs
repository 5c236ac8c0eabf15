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

/// The text of `path`, or of standard input for `-`. Not UTF-8, or unreadable:
/// [`CliError::Read`] (exit 1).
pub fn read_text(path: &Path) -> Result<String, CliError> {
    let read_err = |source| CliError::Read {
        path: PathBuf::from(display_name(path)),
        source,
    };
    if is_stdin(path) {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s).map_err(read_err)?;
        Ok(s)
    } else {
        std::fs::read_to_string(path).map_err(read_err)
    }
}

/// Attaches the local file to a status so its violations print as `FILE:LINE:COL` (`<stdin>`
/// for `-`).
pub fn with_file(file: &Path) -> impl FnOnce(tonic::Status) -> CliError + '_ {
    move |status| CliError::Status {
        status,
        file: Some(PathBuf::from(display_name(file))),
    }
}
