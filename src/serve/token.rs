//! Bearer tokens: the tokens file (`<data dir>/.tokens.json`), `swarm token add | list |
//! revoke`, and the check of a presented token.
//!
//! A token is `swm_<id>_<secret>`: `id` (12 hex digits) names its record, `secret` (64 hex
//! digits, 256 random bits from the OS) is what proves it. The file keeps only the SHA-256
//! of the whole token; a presented token is hashed and compared with the record's hash in
//! constant time (`subtle`). A plain hash (no salt, no key stretching) is enough because
//! the secret is 256 random bits, not a password: nothing can be guessed from the hash.
//!
//! The file is written as a whole (temp file with mode 0600, fsync, rename, directory
//! fsync) under an exclusive `flock` on `.tokens.lock`, so two `swarm token add` never
//! lose each other's record, and a reader sees the old file or the new one. The server
//! notices a new file by its inode, length and modification time (one `stat` per request)
//! and reloads it, so a revocation takes effect on the next request.
//!
//! **Invariant:** a secret is printed once, by `add`, and never stored, logged or returned
//! again.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::error::{Error, IoContext, Result};
use crate::event::ts::Ts;
use crate::event::{check_id, check_path_id, SHARED_USER};

/// Name of the tokens file in the data directory (a leading `.`: never a user id).
pub const TOKENS_FILE: &str = ".tokens.json";
/// Name of the lock file that serializes changes of the tokens file.
const TOKENS_LOCK: &str = ".tokens.lock";
/// Format version of the tokens file.
const TOKENS_FORMAT: u32 = 1;
/// Largest tokens file read (about 300 bytes per token).
const TOKENS_FILE_BYTES_MAX: u64 = 16 * 1024 * 1024;
/// Prefix of every token.
const TOKEN_PREFIX: &str = "swm_";
/// Random bytes of a token id and of a secret.
const ID_BYTES: usize = 6;
const SECRET_BYTES: usize = 32;
/// Agent patterns per token.
const AGENTS_MAX: usize = 64;

/// What a token may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Read, and write as the token's agents.
    Agent,
    /// Read only.
    Reader,
    /// What an agent may, plus operator calls (synth).
    Admin,
}

impl Role {
    /// Parses `agent`, `reader` or `admin`.
    pub fn parse(s: &str) -> Result<Role> {
        match s {
            "agent" => Ok(Role::Agent),
            "reader" => Ok(Role::Reader),
            "admin" => Ok(Role::Admin),
            _ => Err(Error::invalid(
                "role",
                format!("{s:?} is not agent, reader or admin"),
            )),
        }
    }

    /// Whether the role may append (as one of its agents).
    pub fn may_write(self) -> bool {
        matches!(self, Role::Agent | Role::Admin)
    }
}

/// One token's record, as stored (no secret).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TokenRecord {
    /// Public id (the part of the token between `swm_` and the secret).
    pub id: String,
    /// The user every request of this token acts for.
    pub user: String,
    /// Agent ids it may act as: exact names, or `prefix*` (`*` alone: any).
    pub agents: Vec<String>,
    /// What it may do.
    pub role: Role,
    /// SHA-256 of the whole token, hex.
    pub sha256: String,
    /// When it was made.
    pub created: Ts,
    /// When it was revoked, if it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked: Option<Ts>,
}

impl TokenRecord {
    /// Whether this token may act as `agent`.
    pub fn owns_agent(&self, agent: &str) -> bool {
        // The engine's own name is no token's, whatever its patterns.
        agent != crate::event::ENGINE_AGENT
            && self.agents.iter().any(|p| match p.strip_suffix('*') {
                Some(prefix) => agent.starts_with(prefix),
                None => p == agent,
            })
    }

    /// The one agent this token can act as, when its patterns name exactly one.
    pub fn sole_agent(&self) -> Option<&str> {
        match self.agents.as_slice() {
            [a] if !a.ends_with('*') => Some(a),
            _ => None,
        }
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct TokensFile {
    format: u32,
    tokens: Vec<TokenRecord>,
}

/// A new token's record and its secret (shown once).
#[derive(Debug)]
pub struct NewToken {
    /// The stored record.
    pub record: TokenRecord,
    /// The whole token, `swm_<id>_<secret>`.
    pub token: String,
}

fn path_of(data_dir: &Path) -> PathBuf {
    data_dir.join(TOKENS_FILE)
}

fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

fn random_hex(n: usize) -> Result<String> {
    let mut buf = vec![0u8; n];
    getrandom::fill(&mut buf).map_err(|e| Error::Io {
        op: "read random bytes for",
        path: PathBuf::from("a token"),
        source: std::io::Error::other(e.to_string()),
    })?;
    Ok(hex(&buf))
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

fn read_file(path: &Path) -> Result<TokensFile> {
    let f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(TokensFile {
                format: TOKENS_FORMAT,
                tokens: Vec::new(),
            })
        }
        Err(e) => return Err(e).ctx("open", path),
    };
    let mut text = String::new();
    std::io::Read::read_to_string(
        &mut std::io::Read::take(&f, TOKENS_FILE_BYTES_MAX + 1),
        &mut text,
    )
    .ctx("read", path)?;
    if text.len() as u64 > TOKENS_FILE_BYTES_MAX {
        return Err(Error::invalid("tokens file", "larger than 16 MiB"));
    }
    let file: TokensFile = serde_json::from_str(&text)
        .map_err(|e| Error::invalid("tokens file", format!("{}: {e}", path.display())))?;
    if file.format != TOKENS_FORMAT {
        return Err(Error::invalid(
            "tokens file",
            format!("format {} (this build reads {TOKENS_FORMAT})", file.format),
        ));
    }
    Ok(file)
}

/// Runs `change` on the tokens file under its lock and writes the result atomically.
fn update<T>(data_dir: &Path, change: impl FnOnce(&mut TokensFile) -> Result<T>) -> Result<T> {
    std::fs::create_dir_all(data_dir).ctx("create", data_dir)?;
    let lock_path = data_dir.join(TOKENS_LOCK);
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(&lock_path)
        .ctx("open", &lock_path)?;
    lock.lock().ctx("lock", &lock_path)?;
    let path = path_of(data_dir);
    let mut file = read_file(&path)?;
    let out = change(&mut file)?;
    let tmp = data_dir.join(format!("{TOKENS_FILE}.tmp"));
    let mut bytes = serde_json::to_vec_pretty(&file)
        .map_err(|e| Error::invalid("tokens file", e.to_string()))?;
    bytes.push(b'\n');
    {
        let mut f = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(0o600)
            .open(&tmp)
            .ctx("create", &tmp)?;
        f.write_all(&bytes).ctx("write", &tmp)?;
        f.sync_all().ctx("fsync", &tmp)?;
    }
    std::fs::rename(&tmp, &path).ctx("rename", &path)?;
    File::open(data_dir)
        .and_then(|d| d.sync_all())
        .ctx("fsync", data_dir)?;
    Ok(out)
}

/// Makes a token for `user`, acting as `agents` (exact names or `prefix*`), with `role`.
pub fn add(data_dir: &Path, user: &str, agents: &[String], role: Role) -> Result<NewToken> {
    check_path_id("user", user)?;
    if user == SHARED_USER {
        return Err(Error::Forbidden(format!(
            "{user:?} is the shared patterns scope; only the synthesizer writes it"
        )));
    }
    if agents.is_empty() || agents.len() > AGENTS_MAX {
        return Err(Error::invalid(
            "agent",
            format!("give 1..={AGENTS_MAX} agent ids or prefixes"),
        ));
    }
    for a in agents {
        match a.strip_suffix('*') {
            Some("") => {}
            Some(prefix) => check_id("agent", prefix)?,
            None => {
                check_id("agent", a)?;
                crate::event::refuse_reserved_agent(a)?;
            }
        }
    }
    let id = random_hex(ID_BYTES)?;
    let token = format!("{TOKEN_PREFIX}{id}_{}", random_hex(SECRET_BYTES)?);
    let record = TokenRecord {
        id,
        user: user.to_string(),
        agents: agents.to_vec(),
        role,
        sha256: hex(&digest(&token)),
        created: Ts::now(),
        revoked: None,
    };
    let r = record.clone();
    update(data_dir, move |f| {
        f.tokens.push(r);
        Ok(())
    })?;
    Ok(NewToken { record, token })
}

/// Every token's record (no secrets), revoked ones included.
pub fn list(data_dir: &Path) -> Result<Vec<TokenRecord>> {
    Ok(read_file(&path_of(data_dir))?.tokens)
}

/// Revokes the token with this id; its requests get 401 from then on.
pub fn revoke(data_dir: &Path, id: &str) -> Result<TokenRecord> {
    update(data_dir, |f| {
        let t = f
            .tokens
            .iter_mut()
            .find(|t| t.id == id)
            .ok_or_else(|| Error::invalid("id", format!("no token {id:?}")))?;
        if t.revoked.is_none() {
            t.revoked = Some(Ts::now());
        }
        Ok(t.clone())
    })
}

/// The tokens file as the server knows it, reloaded when the file changes.
pub struct TokenSet {
    path: PathBuf,
    loaded: Mutex<Loaded>,
}

#[derive(Default)]
struct Loaded {
    /// (inode, length, mtime ns) of the file read; `None` before the first read or when
    /// there is no file.
    stamp: Option<(u64, u64, i64)>,
    tokens: Vec<TokenRecord>,
}

impl TokenSet {
    /// The tokens of the data directory (none until the file exists).
    pub fn open(data_dir: &Path) -> Result<TokenSet> {
        let set = TokenSet {
            path: path_of(data_dir),
            loaded: Mutex::new(Loaded::default()),
        };
        set.refresh()?;
        Ok(set)
    }

    fn refresh(&self) -> Result<()> {
        let stamp = match std::fs::metadata(&self.path) {
            Ok(m) => Some((m.ino(), m.len(), m.mtime() * 1_000_000_000 + m.mtime_nsec())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(e).ctx("stat", &self.path),
        };
        let mut l = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
        if l.stamp == stamp && stamp.is_some() {
            return Ok(());
        }
        let tokens = match stamp {
            Some(_) => read_file(&self.path)?.tokens,
            None => Vec::new(),
        };
        *l = Loaded { stamp, tokens };
        Ok(())
    }

    /// How often at most a long-lived request asks [`TokenSet::is_live`] again.
    pub const RECHECK_MIN: std::time::Duration = std::time::Duration::from_secs(1);

    /// Whether the token `id` is still live (in the file, not revoked): a long-lived
    /// request (an SSE stream, an NDJSON append) opened with it asks again as it runs,
    /// so a revoked token stops there too, not only at its next request.
    pub fn is_live(&self, id: &str) -> bool {
        if let Err(e) = self.refresh() {
            tracing::warn!(error = %e, "cannot reload the tokens file; keeping the last one read");
        }
        let l = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
        l.tokens.iter().any(|t| t.id == id && t.revoked.is_none())
    }

    /// The live (not revoked) record of a presented token, if it is one. Re-reads the
    /// file first when it changed; a file that cannot be read keeps the last good set
    /// (and the error is logged), so a half-edited file never opens the door.
    pub fn check(&self, presented: &str) -> Option<TokenRecord> {
        if let Err(e) = self.refresh() {
            tracing::warn!(error = %e, "cannot reload the tokens file; keeping the last one read");
        }
        let rest = presented.strip_prefix(TOKEN_PREFIX)?;
        let (id, _) = rest.split_once('_')?;
        let want = digest(presented);
        let l = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
        let rec = l.tokens.iter().find(|t| t.id == id)?;
        let stored = hex_to_bytes(&rec.sha256)?;
        let same: bool = stored.ct_eq(&want).into();
        (same && rec.revoked.is_none()).then(|| rec.clone())
    }
}

fn hex_to_bytes(s: &str) -> Option<[u8; 32]> {
    let b = s.as_bytes();
    if b.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        let pair = std::str::from_utf8(&b[2 * i..2 * i + 2]).ok()?;
        *o = u8::from_str_radix(pair, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_check_revoke() {
        let dir = tempfile::tempdir().unwrap();
        let t = add(dir.path(), "alice", &["db*".to_string()], Role::Agent).unwrap();
        let set = TokenSet::open(dir.path()).unwrap();
        let rec = set.check(&t.token).unwrap();
        assert_eq!(rec.user, "alice");
        assert!(rec.owns_agent("db-1") && !rec.owns_agent("net"));
        // The engine's name is no token's: not by a pattern, not by name.
        let other = tempfile::tempdir().unwrap();
        for p in ["*", "swarm-*", "s*"] {
            let t = add(other.path(), "alice", &[p.to_string()], Role::Admin).unwrap();
            let set = TokenSet::open(other.path()).unwrap();
            let rec = set.check(&t.token).unwrap();
            assert!(
                rec.owns_agent("swarm-x") && !rec.owns_agent("swarm-engine"),
                "{p}"
            );
        }
        assert!(add(
            other.path(),
            "alice",
            &["swarm-engine".to_string()],
            Role::Agent
        )
        .is_err());
        // A wrong secret with the right id is refused.
        let mut forged = t.token.clone();
        let last = forged.pop().unwrap();
        forged.push(if last == '0' { '1' } else { '0' });
        assert!(set.check(&forged).is_none());
        assert!(set.check("swm_nothing").is_none());
        // The file holds no secret and is private.
        let text = std::fs::read_to_string(dir.path().join(TOKENS_FILE)).unwrap();
        let secret = t.token.rsplit('_').next().unwrap();
        assert!(!text.contains(secret));
        let mode = std::fs::metadata(dir.path().join(TOKENS_FILE))
            .unwrap()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        revoke(dir.path(), &t.record.id).unwrap();
        assert!(set.check(&t.token).is_none(), "revocation is seen at once");
        assert!(!set.is_live(&t.record.id), "by id too");
        assert_eq!(list(dir.path()).unwrap().len(), 1);
    }

    #[test]
    fn bad_input_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        assert!(add(dir.path(), "../x", &["a".into()], Role::Agent).is_err());
        assert!(add(dir.path(), "bob", &[], Role::Agent).is_err());
        assert!(add(dir.path(), "bob", &["a b".into()], Role::Agent).is_err());
        assert!(add(dir.path(), SHARED_USER, &["a".into()], Role::Agent).is_err());
        assert!(revoke(dir.path(), "nope").is_err());
        assert!(Role::parse("root").is_err());
    }
}
