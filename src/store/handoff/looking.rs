//! A look for a run's committer under way, which the run's other appends wait for
//! (`Route::Looking`), while other runs' appends go on.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::lock;

/// How long a run's appends wait for one of them looking for its committer (past
/// `HELLO_TIMEOUT`, which bounds a look but for a `connect` that hangs).
const LOOKING_WAIT_MAX: Duration = Duration::from_secs(3);

/// A look for a run's committer under way (`Route::Looking`): done once its route is in.
#[derive(Default)]
pub(super) struct Looking {
    done: Mutex<bool>,
    cv: Condvar,
}

impl Looking {
    /// Waits until the look is done, or `LOOKING_WAIT_MAX`: whether it is done.
    pub(super) fn wait(&self) -> bool {
        let until = Instant::now() + LOOKING_WAIT_MAX;
        let mut done = lock(&self.done);
        while !*done {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            done = self
                .cv
                .wait_timeout(done, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }
}

/// Ends a look (every way out of it, a panic too): its waiters go on.
pub(super) struct LookDone(pub(super) Arc<Looking>);

impl Drop for LookDone {
    fn drop(&mut self) {
        *lock(&self.0.done) = true;
        self.0.cv.notify_all();
    }
}
