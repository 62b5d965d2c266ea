//! `swarm run close|restore`.

use std::process::ExitCode;

use clap::Subcommand;
use swarm_memory::Store;

/// `swarm run ...`
#[derive(Subcommand)]
pub enum RunCmd {
    /// Close a run: append run_closed (appends are refused from then on), archive it into
    /// one zstd file under --archive-dir, verify the archive against the log, then remove
    /// the run from the working set. read, replay and verify keep working on it.
    ///
    /// Example:
    ///   swarm run close inc-42 --by lead
    #[command(verbatim_doc_comment)]
    Close {
        /// The run.
        run: String,
        /// The agent or person closing it.
        #[arg(long, default_value = "operator")]
        by: String,
    },
    /// Bring an archived run back into the working set (still closed for appends).
    Restore {
        /// The run.
        run: String,
    },
}

pub fn run(store: &Store, cmd: RunCmd) -> anyhow::Result<ExitCode> {
    let (info, what) = match cmd {
        RunCmd::Close { run, by } => (store.close_run(&run, &by)?, "run closed"),
        RunCmd::Restore { run } => (store.restore_run(&run)?, "run restored"),
    };
    Ok(crate::scratch::print_ack(&info, what))
}
