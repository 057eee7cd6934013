//! How the Redis store sends its scripts: one command buffer per call.
//!
//! redis-rs's `ScriptInvocation` allocates every key and argument on its
//! own and then copies them all into the command it sends; with a record
//! key, a token, two durations and a packed request per claim, that was
//! about nine allocations (and as many copies) per request. A
//! [`ScriptCall`] writes `EVALSHA <sha1> <number of keys>`, the keys and
//! the arguments straight into one [`redis::Cmd`], and a [`RecordKey`]
//! writes its parts into it without building the key first.

use std::io::Write;

use redis::{Cmd, RedisWrite, Script, ToRedisArgs};

/// One call of a script: `EVALSHA`, the script's SHA-1, the number of keys,
/// then exactly that many keys ([`ScriptCall::arg`]) and then the script's
/// arguments. The store loads the script and sends the call again when
/// Redis does not know it (`NOSCRIPT`), as `ScriptInvocation` does.
pub(super) struct ScriptCall {
    script: &'static Script,
    command: Cmd,
}

impl ScriptCall {
    /// A call of `script` with `keys` keys; `size` is a guess of the bytes
    /// of its keys and arguments (the buffer grows past it if needed).
    pub(super) fn new(script: &'static Script, keys: usize, size: usize) -> Self {
        let mut command = Cmd::with_capacity(3 + keys * 5, 64 + size);
        command.arg("EVALSHA").arg(script.get_hash()).arg(keys);
        Self { script, command }
    }

    /// Appends a key (the first `keys` calls) or an argument.
    pub(super) fn arg(&mut self, arg: impl ToRedisArgs) -> &mut Self {
        self.command.arg(arg);
        self
    }

    /// The script, for loading it when Redis does not know it.
    pub(super) fn script(&self) -> &'static Script {
        self.script
    }

    /// The command to send.
    pub(super) fn command(&self) -> &Cmd {
        &self.command
    }
}

/// `<prefix>:<namespace>:<scope length>:<scope>:<key>`, written into a
/// command as one argument without being built first ([`RecordKey::to_bytes`]
/// builds the same bytes, for routing on a cluster).
pub(super) struct RecordKey<'a> {
    pub(super) prefix: &'a str,
    pub(super) namespace: &'a str,
    pub(super) scope: &'a str,
    pub(super) key: &'a str,
}

impl RecordKey<'_> {
    /// How many bytes the key takes.
    pub(super) fn len(&self) -> usize {
        let mut length = [0; 20];
        self.prefix.len()
            + self.namespace.len()
            + decimal(self.scope.len(), &mut length).len()
            + self.scope.len()
            + self.key.len()
            + 4
    }

    /// The key's bytes.
    pub(super) fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.write_into(&mut out);
        out
    }

    fn write_into(&self, writer: &mut impl Write) {
        let mut length = [0; 20];
        let length = decimal(self.scope.len(), &mut length);
        for part in [
            self.prefix.as_bytes(),
            b":",
            self.namespace.as_bytes(),
            b":",
            length,
            b":",
            self.scope.as_bytes(),
            b":",
            self.key.as_bytes(),
        ] {
            // Writing into a buffer in memory cannot fail.
            let _ = writer.write_all(part);
        }
    }
}

impl ToRedisArgs for RecordKey<'_> {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + RedisWrite,
    {
        self.write_into(&mut out.writer_for_next_arg());
    }
}

/// `n` in decimal, written at the end of `digits`.
fn decimal(n: usize, digits: &mut [u8; 20]) -> &[u8] {
    let mut at = digits.len();
    let mut n = n;
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    &digits[at..]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_key_argument_is_the_record_key() {
        let mut command = Cmd::new();
        let arg = RecordKey {
            prefix: "idem",
            namespace: "r",
            scope: "a:b",
            key: "c d",
        };
        command.arg(&arg);
        let built = arg.to_bytes();
        assert_eq!(built, b"idem:r:3:a:b:c d");
        assert_eq!(arg.len(), built.len());
        let sent: Vec<&[u8]> = command
            .args_iter()
            .map(|arg| match arg {
                redis::Arg::Simple(bytes) => bytes,
                _ => &b""[..],
            })
            .collect();
        assert_eq!(sent, vec![built.as_slice()]);
    }
}
