//! SIGHUP: the configuration file is read again; what can change while running changes,
//! what needs a restart is kept (with a warning), and the epoch loop gets the new file.

use super::Agent;
use crate::config::Config;

impl Agent {
    /// SIGHUP: re-read the configuration file. A file that does not load leaves everything
    /// as it was and says why; keys that need a restart (interfaces, pins, namespace) are
    /// kept with a warning. Nothing is detached.
    pub fn reload(&mut self) {
        let new = match Config::load(&self.cfg.path) {
            Ok(c) => c,
            Err(e) => {
                log::error!("reload REFUSED, the running configuration stays: {e}");
                self.reload_error = Some(e.to_string());
                return;
            }
        };
        for (key, same) in [
            ("interfaces", new.interfaces == self.cfg.interfaces),
            ("pin_root", new.pin_root == self.cfg.pin_root),
            ("netns", new.netns == self.cfg.netns),
            ("state_dir", new.state_dir == self.cfg.state_dir),
            (
                "control_socket",
                new.control_socket == self.cfg.control_socket,
            ),
            ("attach_mode", new.attach_mode == self.cfg.attach_mode),
            (
                "refusal_cgroup",
                new.refusal_cgroup == self.cfg.refusal_cgroup,
            ),
        ] {
            if !same {
                log::warn!("reload: `{key}` changed; it takes effect at the next restart");
            }
        }
        let next = Config {
            interfaces: self.cfg.interfaces.clone(),
            interface_lines: self.cfg.interface_lines.clone(),
            pin_root: self.cfg.pin_root.clone(),
            netns: self.cfg.netns.clone(),
            state_dir: self.cfg.state_dir.clone(),
            control_socket: self.cfg.control_socket.clone(),
            attach_mode: self.cfg.attach_mode,
            refusal_cgroup: self.cfg.refusal_cgroup.clone(),
            ..new
        };
        if next.epoch.is_some() && self.epoch.is_none() {
            log::warn!(
                "reload: an [epoch] section was added; the epoch loop starts at the next restart"
            );
        }
        self.cfg = next;
        if let Err(e) = self.write_caps_from_config() {
            log::error!("reload: writing the caps failed: {e}");
            self.reload_error = Some(e.to_string());
            return;
        }
        if let Some(h) = &self.epoch {
            let _ = h.commands.send(crate::epoch::EpochCommand::Reload(Box::new(
                self.cfg.clone(),
            )));
        }
        self.reload_error = None;
        log::info!("reloaded {}", self.cfg.path.display());
    }
}
