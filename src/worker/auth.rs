//! Who may drive a worker over TCP: a worker proves it holds the run's secret before the
//! handshake, and any other connection is refused.
//!
//! The head makes one random secret per process (so per run) and gives it to the workers it
//! starts in their environment (`ROLL_CLUSTER_SECRET`, the way a launcher passes environment: never
//! on a command line, where `ps` on any node would show it, and never in the store). On each
//! connection the head sends a fresh random nonce; the worker answers with
//! HMAC-SHA256(secret, nonce ‖ role ‖ index), which the head checks in constant time. The secret
//! never crosses the wire, a recorded answer is useless for another nonce, and an answer for one
//! worker cannot start another.

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use super::Role;

/// The environment variable that carries the secret to a worker.
pub const SECRET_ENV: &str = "ROLL_CLUSTER_SECRET";

/// Random bytes of the secret and of each nonce.
const BYTES: usize = 32;

/// A run's secret, hex-encoded.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(…)")
    }
}

impl Secret {
    /// A fresh random secret.
    pub fn generate() -> Secret {
        Secret(hex::encode(rand::random::<[u8; BYTES]>()))
    }

    /// The secret as its holder knows it (the value of [`SECRET_ENV`]).
    pub fn from_text(text: &str) -> Secret {
        Secret(text.trim().to_string())
    }

    pub fn as_text(&self) -> &str {
        &self.0
    }

    fn mac(&self, nonce: &str, role: Role, index: usize) -> Hmac<Sha256> {
        // HMAC takes a key of any length.
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(self.0.as_bytes())
            .unwrap_or_else(|_| unreachable!("HMAC accepts every key length"));
        mac.update(nonce.as_bytes());
        mac.update(format!("\0{role}\0{index}").as_bytes());
        mac
    }

    /// The worker's answer to `nonce`.
    pub fn prove(&self, nonce: &str, role: Role, index: usize) -> String {
        hex::encode(self.mac(nonce, role, index).finalize().into_bytes())
    }

    /// Whether `proof` answers `nonce` for worker `index` of `role` (compared in constant time).
    pub fn verify(&self, nonce: &str, role: Role, index: usize, proof: &str) -> bool {
        match hex::decode(proof) {
            Ok(bytes) => self.mac(nonce, role, index).verify_slice(&bytes).is_ok(),
            Err(_) => false,
        }
    }
}

/// The secret of this process's run, made at first use.
pub fn run_secret() -> &'static Secret {
    static SECRET: std::sync::OnceLock<Secret> = std::sync::OnceLock::new();
    SECRET.get_or_init(Secret::generate)
}

/// A fresh nonce for one connection.
pub fn nonce() -> String {
    hex::encode(rand::random::<[u8; BYTES]>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_secrets_answer_to_this_nonce_for_this_worker_is_accepted() {
        let secret = Secret::generate();
        let n = nonce();
        let proof = secret.prove(&n, Role::Reference, 0);
        assert!(secret.verify(&n, Role::Reference, 0, &proof));
        // Another nonce, another worker, another secret, or garbage: refused.
        assert!(!secret.verify(&nonce(), Role::Reference, 0, &proof));
        assert!(!secret.verify(&n, Role::Reference, 1, &proof));
        assert!(!secret.verify(&n, Role::Critic, 0, &proof));
        assert!(!Secret::generate().verify(&n, Role::Reference, 0, &proof));
        assert!(!secret.verify(&n, Role::Reference, 0, "not hex"));
        assert!(!secret.verify(&n, Role::Reference, 0, ""));
        // The same secret read back from its text proves the same.
        let again = Secret::from_text(&format!(" {}\n", secret.as_text()));
        assert_eq!(again.prove(&n, Role::Reference, 0), proof);
        assert_eq!(format!("{secret:?}"), "Secret(…)", "never printed");
        assert_ne!(Secret::generate(), Secret::generate());
    }
}
