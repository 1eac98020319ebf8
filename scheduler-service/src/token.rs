//! Job tokens: 128 random bits from the OS, handed out once as hex; the
//! scheduler keeps only their SHA-256 and compares in constant time.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// What the scheduler keeps of a token.
#[derive(Clone)]
pub struct TokenHash([u8; 32]);

impl std::fmt::Debug for TokenHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenHash(..)")
    }
}

impl TokenHash {
    pub fn of(token: &str) -> TokenHash {
        TokenHash(Sha256::digest(token.as_bytes()).into())
    }

    /// Whether `token` is the one hashed, in time independent of where
    /// they differ.
    pub fn matches(&self, token: &str) -> bool {
        TokenHash::of(token).0.ct_eq(&self.0).into()
    }
}

/// A fresh token (32 hex digits) and its hash.
pub fn new_token() -> Result<(String, TokenHash), getrandom::Error> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)?;
    let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let hash = TokenHash::of(&token);
    Ok((token, hash))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn tokens_are_random_and_only_their_own_hash_matches() {
        let (a, ha) = new_token().unwrap();
        let (b, hb) = new_token().unwrap();
        assert_eq!(a.len(), 32);
        assert_ne!(a, b);
        assert!(ha.matches(&a) && hb.matches(&b));
        assert!(!ha.matches(&b) && !ha.matches("") && !ha.matches(&a[..31]));
    }
}
