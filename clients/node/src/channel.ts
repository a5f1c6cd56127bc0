/**
 * The gRPC channels clients use: one per target and transport settings, shared by every client of the
 * process that asks for the same (so one HTTP/2 connection carries all their calls), and closed when
 * the last of them closes.
 */
import { createHash } from 'node:crypto';

import * as grpc from '@grpc/grpc-js';

/** Tollgate's gRPC port on the same host. */
export const DEFAULT_TARGET = '127.0.0.1:8081';

/** TLS for the channel a client opens. Contents, not paths: `fs.readFileSync('ca.pem')`. */
export interface TlsOptions {
  /** PEM certificates to trust; by default Node's own roots. */
  readonly ca?: string | Buffer;
  /** For mTLS: the client's PEM certificate chain (with `key`). */
  readonly cert?: string | Buffer;
  /** For mTLS: the client's PEM private key (with `cert`). */
  readonly key?: string | Buffer;
  /**
   * The name to check the server's certificate against (and to send as the authority), when the target
   * does not name the server: an IP address, or a `unix:` socket.
   */
  readonly serverName?: string;
}

/** Where and how a client reaches Tollgate. @internal */
export interface ChannelConfig {
  readonly target: string;
  readonly tls: TlsOptions | undefined;
  readonly credentials: grpc.ChannelCredentials | undefined;
  readonly channelOptions: grpc.ChannelOptions | undefined;
  readonly shared: boolean;
}

/** A channel a client holds; `close` gives it back. @internal */
export interface HeldChannel {
  readonly channel: grpc.Channel;
  close(): void;
}

// gRPC waits up to two minutes between reconnection attempts by default, and fails calls at once while
// it waits: a Tollgate restarted during a deploy would see its clients fail open (or closed) for that
// long after it is back. Two seconds bounds that gap. The keepalive pings find a connection whose peer
// vanished without a reset, instead of every call waiting out its deadline on it until TCP gives up.
// The same settings as the Rust and Python clients.
const DEFAULT_OPTIONS: grpc.ChannelOptions = {
  'grpc.max_reconnect_backoff_ms': 2000,
  'grpc.keepalive_time_ms': 10_000,
  'grpc.keepalive_timeout_ms': 5000,
  'grpc.keepalive_permit_without_calls': 1,
};

interface Shared {
  readonly channel: grpc.Channel;
  users: number;
}

/** The shared channels by their settings. As many as the distinct settings clients are made with. */
const channels = new Map<string, Shared>();
/** Credentials objects a caller passed, numbered: two are the same only when they are one object. */
const credentialIds = new WeakMap<grpc.ChannelCredentials, number>();
let nextCredentialId = 0;

/** The channel for `config`: the process's shared one for the same settings, or a new one. @internal */
export function openChannel(config: ChannelConfig): HeldChannel {
  checkTarget(config.target);
  if (config.tls !== undefined && config.credentials !== undefined) {
    throw new TypeError('tls and credentials both configure the channel: pass one of them');
  }
  const options: grpc.ChannelOptions = { ...DEFAULT_OPTIONS, ...config.channelOptions };
  if (config.tls?.serverName !== undefined) {
    options['grpc.ssl_target_name_override'] = config.tls.serverName;
    options['grpc.default_authority'] = config.tls.serverName;
  }
  const credentials = config.credentials ?? credentialsFor(config.tls);
  if (!config.shared) {
    const channel = new grpc.Channel(config.target, credentials, options);
    return { channel, close: () => channel.close() };
  }
  const key = JSON.stringify([config.target, credentialsKey(config), Object.entries(options).sort()]);
  let entry = channels.get(key);
  if (entry === undefined) {
    entry = { channel: new grpc.Channel(config.target, credentials, options), users: 0 };
    channels.set(key, entry);
  }
  entry.users += 1;
  const held = entry;
  let closed = false;
  return {
    channel: held.channel,
    close: () => {
      if (closed) {
        return;
      }
      closed = true;
      held.users -= 1;
      if (held.users === 0) {
        channels.delete(key);
        held.channel.close();
      }
    },
  };
}

function checkTarget(target: string): void {
  if (typeof target !== 'string' || target === '') {
    throw new TypeError(`target is Tollgate's gRPC address, such as '127.0.0.1:8081', got ${String(target)}`);
  }
  if (/^(https?|grpcs?):\/\//i.test(target)) {
    throw new TypeError(
      `target is host:port (or unix:/path), not a URL, got '${target}': ` +
        "drop the scheme, and pass tls: {...} for TLS",
    );
  }
}

function credentialsFor(tls: TlsOptions | undefined): grpc.ChannelCredentials {
  if (tls === undefined) {
    return grpc.credentials.createInsecure();
  }
  if ((tls.cert === undefined) !== (tls.key === undefined)) {
    throw new TypeError('tls.cert and tls.key come together: both for mTLS, neither for TLS');
  }
  return grpc.credentials.createSsl(bytes(tls.ca), bytes(tls.key), bytes(tls.cert));
}

function credentialsKey(config: ChannelConfig): string {
  if (config.credentials !== undefined) {
    let id = credentialIds.get(config.credentials);
    if (id === undefined) {
      id = nextCredentialId++;
      credentialIds.set(config.credentials, id);
    }
    return `credentials ${id}`;
  }
  if (config.tls === undefined) {
    return 'insecure';
  }
  // A digest, so the map's keys hold no private key.
  const digest = createHash('sha256');
  for (const part of [config.tls.ca, config.tls.cert, config.tls.key]) {
    digest.update(part === undefined ? '-' : `${Buffer.byteLength(part)}:`).update(part ?? '');
  }
  return `tls ${digest.digest('hex')}`;
}

function bytes(pem: string | Buffer | undefined): Buffer | null {
  return pem === undefined ? null : Buffer.from(pem);
}
