//! Maps keyed by lease token, hashed by folding the token's bytes: a token
//! is 16 random bytes this process drew (a version 4 UUID), so they need
//! no keyed hash (SipHash cost a few hundred instructions per request, for
//! each lookup). The stores keep what their own claims wrote in them.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use super::LeaseToken;

/// A map keyed by lease token, with the folding hasher.
pub(crate) type TokenMap<V> = HashMap<LeaseToken, V, BuildHasherDefault<TokenHasher>>;

/// The hasher of [`TokenMap`].
#[derive(Default)]
pub(crate) struct TokenHasher(u64);

impl Hasher for TokenHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0_u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.0 = self.0.rotate_left(29) ^ u64::from_le_bytes(word);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}
