//! A `nats-server -js` of a test's own: loopback, a free port, its store in the test's
//! folder (Debian's `nats-server` package; `scripts/setup --dev` installs it).

use super::free_port;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Nats {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Nats {
    pub fn start(dir: &Path) -> Nats {
        Self::start_on(dir, free_port())
    }

    fn start_on(dir: &Path, port: u16) -> Nats {
        let store = dir.join("nats");
        std::fs::create_dir_all(&store).expect("the store's folder");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("nats.log"))
            .expect("the server's log");
        let child = Command::new("nats-server")
            .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
            .arg(&store)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("nats-server (Debian package nats-server; scripts/setup installs it)");
        let t = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "nats-server did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Nats {
            child,
            port,
            dir: dir.to_path_buf(),
        }
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Stops the server (SIGTERM: JetStream's files are flushed) and starts it again on the
    /// same port and store.
    pub fn restart(&mut self, down: Duration) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
        std::thread::sleep(down);
        let again = Nats::start_on(&self.dir, self.port);
        let old = std::mem::replace(self, again);
        std::mem::forget(old);
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
