/** Descriptors as callers write them, checked and turned into the wire's form. */
import type * as wire from './wire.js';

/** An entry's value: a string, or a number (written in decimal, as `String(n)` does). */
export type Value = string | number;

/**
 * One descriptor: its `key: value` entries in order, matched against the rules' nested keys in that
 * order, as Envoy's descriptors are. `{ path: '/auth/otp', phone: '5550100' }` (an object's order is its
 * keys' insertion order), `new Map([...])` or `[['path', '/auth/otp'], ['phone', '5550100']]`: use pairs
 * or a Map when a key looks like a number (`'42'`), which an object would move to the front.
 */
export type Entries =
  | Readonly<Record<string, Value>>
  | ReadonlyMap<string, Value>
  | ReadonlyArray<readonly [string, Value]>;

/**
 * The descriptors of one request, each checked against its own rules:
 * `[{ user: '42' }, { route: '/export' }]` is two descriptors.
 */
export type Descriptors = ReadonlyArray<Entries>;

/**
 * Checks the shape of `descriptors` and copies them into the wire's form, so a caller changing its
 * objects later changes nothing here. Throws a TypeError with a hint for the usual slips: one descriptor
 * passed where an array of them is expected, and a value that is not a string or a number (an
 * `undefined` header, say, which would otherwise be checked as the string "undefined").
 * @internal
 */
export function toWire(descriptors: Descriptors): wire.Descriptor[] {
  if (!Array.isArray(descriptors)) {
    throw new TypeError(
      `descriptors are an array of descriptors, got ${kind(descriptors)}: wrap a single descriptor in an array`,
    );
  }
  return descriptors.map((entries: Entries) => ({ entries: entriesOf(entries) }));
}

function entriesOf(entries: Entries): wire.Entry[] {
  const pairs: wire.Entry[] = [];
  if (Array.isArray(entries)) {
    for (const pair of entries as ReadonlyArray<unknown>) {
      if (!Array.isArray(pair) || pair.length !== 2 || typeof pair[0] !== 'string') {
        throw new TypeError(
          `a descriptor given as an array holds [key, value] pairs, got ${kind(pair)} ` +
            '(one descriptor where an array of them was expected?)',
        );
      }
      pairs.push({ key: pair[0], value: valueOf(pair[0], pair[1]) });
    }
  } else if (entries instanceof Map) {
    for (const [key, value] of entries) {
      if (typeof key !== 'string') {
        throw new TypeError(`a descriptor's keys are strings, got ${kind(key)}`);
      }
      pairs.push({ key, value: valueOf(key, value) });
    }
  } else if (typeof entries === 'object' && entries !== null) {
    const record = entries as Readonly<Record<string, unknown>>;
    for (const key of Object.keys(record)) {
      pairs.push({ key, value: valueOf(key, record[key]) });
    }
  } else {
    throw new TypeError(`a descriptor is an object, a Map or an array of [key, value] pairs, got ${kind(entries)}`);
  }
  return pairs;
}

function valueOf(key: string, value: unknown): string {
  if (typeof value === 'string') {
    return value;
  }
  if (typeof value === 'number' && Number.isFinite(value)) {
    return String(value);
  }
  // The value itself stays out of the message: it may be a caller's data.
  throw new TypeError(`descriptor entry '${key}' has a value of type ${kind(value)}; values are strings or numbers`);
}

function kind(value: unknown): string {
  if (value === null) {
    return 'null';
  }
  if (Array.isArray(value)) {
    return 'an array';
  }
  return typeof value === 'number' && !Number.isFinite(value) ? String(value) : typeof value;
}
