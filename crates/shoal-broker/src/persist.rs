//! Small JSON config files written atomically (temp file, fsync, rename, fsync of the folder).

use serde::de::DeserializeOwned;
use serde::Serialize;
use std::io::Write;
use std::path::Path;

/// Errors reading or writing a config file; both name the file.
#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    /// I/O failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The file is not valid JSON of the expected shape.
    #[error("{path} is corrupt: {reason} (fix it, or restore it from a backup; the broker does not start without its config tables)")]
    Corrupt {
        /// The file.
        path: String,
        /// Parser message.
        reason: String,
    },
}

/// Writes `value` as pretty JSON to `path` atomically.
pub(crate) fn write_json_atomic<T: Serialize>(path: &Path, value: &T) -> Result<(), PersistError> {
    let io = |source| PersistError::Io {
        path: path.display().to_string(),
        source,
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io)?;
    let json = serde_json::to_vec_pretty(value).map_err(|e| io(std::io::Error::other(e)))?;
    let tmp = path.with_extension("json.tmp");
    {
        let mut f = std::fs::File::create(&tmp).map_err(io)?;
        f.write_all(&json).map_err(io)?;
        f.sync_all().map_err(io)?;
    }
    std::fs::rename(&tmp, path).map_err(io)?;
    if let Ok(d) = std::fs::File::open(dir) {
        // Best effort: some file systems refuse to fsync a directory.
        let _ = d.sync_all();
    }
    Ok(())
}

/// Reads JSON from `path`; `Ok(None)` when the file does not exist.
pub(crate) fn read_json<T: DeserializeOwned>(path: &Path) -> Result<Option<T>, PersistError> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(PersistError::Io {
                path: path.display().to_string(),
                source,
            })
        }
    };
    shoal_proto::body::from_json_slice(&bytes)
        .map(Some)
        .map_err(|e| PersistError::Corrupt {
            path: path.display().to_string(),
            reason: e.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn round_trip_missing_and_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("config/x.json");
        assert!(read_json::<BTreeMap<String, i32>>(&p).unwrap().is_none());
        let mut m = BTreeMap::new();
        m.insert("a".to_string(), 1);
        write_json_atomic(&p, &m).unwrap();
        assert_eq!(read_json::<BTreeMap<String, i32>>(&p).unwrap(), Some(m));
        std::fs::write(&p, b"[1,").unwrap();
        let e = read_json::<BTreeMap<String, i32>>(&p).unwrap_err();
        assert!(e.to_string().contains("x.json"), "{e}");
    }
}
