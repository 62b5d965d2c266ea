//! Where the server listens besides TCP: a Unix socket (`--socket PATH`).
//!
//! The socket file is made mode 0600 before anyone can connect: it is bound inside a
//! fresh private directory (0700) next to `PATH`, chmodded, then renamed into place.
//! An existing `PATH` is refused when something answers on it (another server), removed
//! when it is a socket nobody listens on (a crashed server's), and refused when it is not
//! a socket (never delete a file the server did not make). At shutdown the server removes
//! the socket it made, unless another file has replaced it since.

use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

/// Longest socket path the kernel takes (`sun_path` is 108 bytes with its NUL).
pub const SOCKET_PATH_BYTES_MAX: usize = 107;

/// A bound Unix socket and the file it made.
pub struct UnixSocket {
    /// The listener.
    pub listener: tokio::net::UnixListener,
    /// The socket file.
    pub path: PathBuf,
    /// Its (device, inode): removed at shutdown only if the file is still this one.
    id: (u64, u64),
}

fn refuse(path: &Path, why: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("--socket {}: {why}", path.display()))
}

/// Binds `path` (see the module doc). Needs a tokio runtime.
pub fn bind_unix(path: &Path) -> io::Result<UnixSocket> {
    let len = path.as_os_str().len();
    if len == 0 || len > SOCKET_PATH_BYTES_MAX {
        return Err(refuse(
            path,
            format!("a socket path is 1..={SOCKET_PATH_BYTES_MAX} bytes, this one is {len}"),
        ));
    }
    let Some(name) = path.file_name() else {
        return Err(refuse(path, "names no file"));
    };
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => match UnixStream::connect(path) {
            Ok(_) => {
                return Err(refuse(
                    path,
                    "another server is listening on it; stop it or choose another path",
                ))
            }
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                tracing::warn!(path = %path.display(), "removing a stale socket (nothing listens on it)");
                std::fs::remove_file(path)
                    .map_err(|e| refuse(path, format!("cannot remove the stale socket: {e}")))?;
            }
            Err(e) => return Err(refuse(path, format!("exists and cannot be checked: {e}"))),
        },
        Ok(_) => {
            return Err(refuse(
                path,
                "exists and is not a socket; remove it or choose another path",
            ))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(refuse(path, e)),
    }
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    // A private directory: nobody else can reach the socket before its mode is 0600.
    let private = parent.join(format!(".swarm-sock-{}", std::process::id()));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&private)
        .map_err(|e| refuse(path, format!("cannot create {}: {e}", private.display())))?;
    let bound = (|| {
        let inner = private.join(name);
        let l = std::os::unix::net::UnixListener::bind(&inner)
            .map_err(|e| refuse(path, format!("cannot bind: {e}")))?;
        std::fs::set_permissions(&inner, std::fs::Permissions::from_mode(0o600))?;
        std::fs::rename(&inner, path)
            .map_err(|e| refuse(path, format!("cannot move into place: {e}")))?;
        Ok::<_, io::Error>(l)
    })();
    let _ = std::fs::remove_dir_all(&private);
    let l = bound?;
    l.set_nonblocking(true)?;
    let m = std::fs::symlink_metadata(path)?;
    Ok(UnixSocket {
        listener: tokio::net::UnixListener::from_std(l)?,
        path: path.to_path_buf(),
        id: (m.dev(), m.ino()),
    })
}

impl UnixSocket {
    /// Removes the socket file, if it is still the one this server made.
    pub fn remove(&self) {
        if let Ok(m) = std::fs::symlink_metadata(&self.path) {
            if (m.dev(), m.ino()) == self.id {
                let _ = std::fs::remove_file(&self.path);
            }
        }
    }
}
