// Tango (@yume-chan/adb, an independent TypeScript implementation of the ADB
// host side) driving an ADB daemon over TCP, for tests/interop/test_tango.py.
//
//   node tango_client.mjs --port PORT [--host 127.0.0.1] [--timeout SECONDS]
//        [--no-delayed-ack] [--parallel] COMMAND ARGS... [-- COMMAND ARGS...]...
//
// Commands (all over ONE authenticated ADB connection; in order, or all at
// once, each on its own streams, with --parallel):
//   features                       the device banner, the negotiated features
//   shell CMD [--stdin-b64 DATA] [--digest]
//                                  shell protocol v2 (`shell,v2,raw:CMD`):
//                                  stdout (base64, or its size and sha256
//                                  with --digest), stderr (base64), exit code
//   pty CMD [--term T] [--resize ROWSxCOLS] [--input-b64 DATA]
//                                  `shell,v2,pty,TERM=T:CMD`: window-size
//                                  frame, then DATA as stdin; output, exit code
//   push LOCAL REMOTE [--mode OCTAL] [--mtime SECONDS] [--dry-run]
//                                  AdbSync.write (SND2 when the device has
//                                  sendrecv_v2, else SEND)
//   pull REMOTE LOCAL [--stall-ms N]
//                                  AdbSync.read (RECV), streamed to LOCAL;
//                                  --stall-ms: stop reading for N ms after
//                                  the first chunk
//   stat REMOTE                    AdbSync.stat (STA2) and AdbSync.lstat (LST2)
//   ls REMOTE                      AdbSync.readdir (LIS2)
//
// Output: one JSON document on stdout:
//   {"ok": true, "results": [...one per command...], "connection": {...}}
// or, on any failure, {"ok": false, "error": "...", ...} and exit status 1.
// "connection" holds what this script saw on the wire (packets per command,
// OPEN arg1 values, OKAY payload sizes, the most WRTE packets one stream had
// in flight without an OKAY, the credit the device granted in its first
// OKAY, the most bytes the device had sent beyond the host's
// acknowledgements), so a test can check that delayed_ack really was in
// effect, independently of both Tango's and the daemon's own claims.
//
// The TCP connection is built here (Tango ships only WebUSB and adb-server
// transports): a ReadableStream<AdbPacketData> decoded from the socket and a
// Consumable.WritableStream<AdbPacketInit> encoded onto it, 24-byte header of
// six little-endian u32 (command, arg0, arg1, length, checksum, magic).
// Tango insists on a credential store; this one is in memory and holds one
// RSA-2048 key made with WebCrypto (PKCS#8, which is what Tango signs with).

import { createHash, webcrypto } from "node:crypto";
import { once } from "node:events";
import fs from "node:fs";
import net from "node:net";
import { Readable } from "node:stream";

import {
    ADB_DAEMON_DEFAULT_FEATURES,
    Adb,
    AdbDaemonTransport,
    AdbFeature,
    adbGeneratePublicKey,
} from "@yume-chan/adb";
import { Consumable, ReadableStream } from "@yume-chan/stream-extra";

const A_CNXN = 0x4e584e43;
const A_OPEN = 0x4e45504f;
const A_OKAY = 0x59414b4f;
const A_WRTE = 0x45545257;
const A_CLSE = 0x45534c43;
const A_AUTH = 0x48545541;
const NAMES = {
    [A_CNXN]: "CNXN",
    [A_OPEN]: "OPEN",
    [A_OKAY]: "OKAY",
    [A_WRTE]: "WRTE",
    [A_CLSE]: "CLSE",
    [A_AUTH]: "AUTH",
};
const HEADER = 24;
// Tango's CNXN offers arg1 = 1 MiB: a daemon may never send a larger payload.
const MAX_ACCEPTED_PAYLOAD = 1024 * 1024;

// --- arguments ----------------------------------------------------------------

function parseArgs(argv) {
    const opts = { host: "127.0.0.1", port: 0, timeout: 90, delayedAck: true, parallel: false };
    let i = 0;
    while (i < argv.length && argv[i].startsWith("--")) {
        const flag = argv[i];
        if (flag === "--") {
            i++;
            break;
        }
        if (flag === "--no-delayed-ack") {
            opts.delayedAck = false;
            i++;
        } else if (flag === "--parallel") {
            opts.parallel = true;
            i++;
        } else if (flag === "--host" || flag === "--port" || flag === "--timeout") {
            if (i + 1 >= argv.length) throw new Error(`${flag} needs a value`);
            const v = argv[i + 1];
            if (flag === "--host") opts.host = v;
            else opts[flag.slice(2)] = Number(v);
            i += 2;
        } else {
            throw new Error(`unknown option ${flag}`);
        }
    }
    if (!Number.isInteger(opts.port) || opts.port <= 0) throw new Error("--port is required");
    const commands = [];
    let current = [];
    for (; i < argv.length; i++) {
        if (argv[i] === "--") {
            if (current.length) commands.push(current);
            current = [];
        } else {
            current.push(argv[i]);
        }
    }
    if (current.length) commands.push(current);
    if (!commands.length) throw new Error("no command given");
    return { opts, commands };
}

// --- wire statistics ------------------------------------------------------------

const wire = {
    sent: {},
    received: {},
    cnxnSent: null,
    cnxnReceived: null,
    authRequests: 0,
    openArg1: [],
    okayPayloadSizesReceived: {},
    okayPayloadSizesSent: {},
    maxWrtesInFlight: 0,
    // The largest WRTE payload each way: never above the max payload of the
    // CNXN the other side sent.
    maxWrtePayloadSent: 0,
    maxWrtePayloadReceived: 0,
    // delayed_ack credit as seen from the host: bytes the device sent on a
    // stream minus the bytes the host acknowledged (its OKAY payloads).
    maxDeviceBytesUnacked: 0,
    // The 4-byte payload of the device's first OKAY of each stream (the credit it grants).
    deviceInitialCredit: [],
    bytesWritten: 0,
    bytesRead: 0,
};
// Per local stream id: WRTE packets sent since the last OKAY from the device.
const inFlight = new Map();
// Per local stream id: payload bytes received from the device, bytes acknowledged.
const deviceBytes = new Map();
const hostAcked = new Map();
const okayedStreams = new Set();

function count(table, command) {
    const name = NAMES[command] ?? `0x${(command >>> 0).toString(16)}`;
    table[name] = (table[name] ?? 0) + 1;
}

function bump(table, key) {
    table[key] = (table[key] ?? 0) + 1;
}

function noteSent(p) {
    count(wire.sent, p.command);
    if (p.command === A_CNXN) wire.cnxnSent = Buffer.from(p.payload).toString("latin1");
    if (p.command === A_OPEN) wire.openArg1.push(p.arg1 >>> 0);
    if (p.command === A_OKAY) {
        bump(wire.okayPayloadSizesSent, p.payload.length);
        if (p.payload.length === 4) {
            const acked = Buffer.from(p.payload).readInt32LE(0);
            hostAcked.set(p.arg0, (hostAcked.get(p.arg0) ?? 0) + acked);
        }
    }
    if (p.command === A_WRTE) {
        wire.maxWrtePayloadSent = Math.max(wire.maxWrtePayloadSent, p.payload.length);
        const n = (inFlight.get(p.arg0) ?? 0) + 1;
        inFlight.set(p.arg0, n);
        wire.maxWrtesInFlight = Math.max(wire.maxWrtesInFlight, n);
    }
}

function noteReceived(p) {
    count(wire.received, p.command);
    if (p.command === A_CNXN) wire.cnxnReceived = Buffer.from(p.payload).toString("latin1");
    if (p.command === A_AUTH) wire.authRequests++;
    if (p.command === A_OKAY) {
        bump(wire.okayPayloadSizesReceived, p.payload.length);
        inFlight.set(p.arg1, 0);
        if (!okayedStreams.has(p.arg1)) {
            okayedStreams.add(p.arg1);
            if (p.payload.length === 4) wire.deviceInitialCredit.push(Buffer.from(p.payload).readInt32LE(0));
        }
    }
    if (p.command === A_WRTE) {
        wire.maxWrtePayloadReceived = Math.max(wire.maxWrtePayloadReceived, p.payload.length);
        const got = (deviceBytes.get(p.arg1) ?? 0) + p.payload.length;
        deviceBytes.set(p.arg1, got);
        wire.maxDeviceBytesUnacked = Math.max(wire.maxDeviceBytesUnacked, got - (hostAcked.get(p.arg1) ?? 0));
    }
}

// --- the TCP connection as an AdbDaemonConnection ------------------------------

/** Bytes arrive in arbitrary pieces; take exactly `n` without quadratic copying. */
class ByteQueue {
    #chunks = [];
    length = 0;
    push(chunk) {
        this.#chunks.push(chunk);
        this.length += chunk.length;
    }
    take(n) {
        const out = Buffer.allocUnsafeSlow(n);
        let filled = 0;
        while (filled < n) {
            const head = this.#chunks[0];
            const want = n - filled;
            if (head.length <= want) {
                head.copy(out, filled);
                filled += head.length;
                this.#chunks.shift();
            } else {
                head.copy(out, filled, 0, want);
                this.#chunks[0] = head.subarray(want);
                filled += want;
            }
        }
        this.length -= n;
        return out;
    }
}

function tcpConnection(socket) {
    const queue = new ByteQueue();
    let header = null;
    const readable = new ReadableStream(
        {
            start(controller) {
                socket.on("data", (chunk) => {
                    queue.push(chunk);
                    try {
                        for (;;) {
                            if (!header) {
                                if (queue.length < HEADER) break;
                                const h = queue.take(HEADER);
                                header = {
                                    command: h.readUInt32LE(0),
                                    arg0: h.readUInt32LE(4),
                                    arg1: h.readUInt32LE(8),
                                    length: h.readUInt32LE(12),
                                    checksum: h.readUInt32LE(16),
                                    magic: h.readUInt32LE(20),
                                };
                                if (header.magic !== (header.command ^ 0xffffffff) >>> 0) {
                                    throw new Error(`bad magic in packet header ${h.toString("hex")}`);
                                }
                                if (header.length > MAX_ACCEPTED_PAYLOAD) {
                                    throw new Error(`daemon sent a ${header.length}-byte payload, more than the ${MAX_ACCEPTED_PAYLOAD} the host offered`);
                                }
                            }
                            if (queue.length < header.length) break;
                            const payload = header.length ? queue.take(header.length) : new Uint8Array(0);
                            const packet = {
                                command: header.command,
                                arg0: header.arg0,
                                arg1: header.arg1,
                                payload: new Uint8Array(payload.buffer, payload.byteOffset, payload.length),
                            };
                            header = null;
                            wire.bytesRead += HEADER + packet.payload.length;
                            noteReceived(packet);
                            controller.enqueue(packet);
                        }
                    } catch (e) {
                        controller.error(e);
                        socket.destroy();
                        return;
                    }
                    if (controller.desiredSize !== null && controller.desiredSize <= 0) socket.pause();
                });
                socket.on("end", () => {
                    try {
                        controller.close();
                    } catch {
                        // already errored or closed
                    }
                });
                socket.on("error", (e) => {
                    try {
                        controller.error(e);
                    } catch {
                        // already errored or closed
                    }
                });
            },
            pull() {
                socket.resume();
            },
            cancel() {
                socket.destroy();
            },
        },
        { highWaterMark: 64 },
    );

    const writable = new Consumable.WritableStream({
        async write(p) {
            const length = p.payload.length;
            // The payload may be a view into a buffer Tango reuses once this
            // write resolves: copy it together with the header.
            const buf = Buffer.allocUnsafe(HEADER + length);
            buf.writeUInt32LE(p.command >>> 0, 0);
            buf.writeUInt32LE(p.arg0 >>> 0, 4);
            buf.writeUInt32LE(p.arg1 >>> 0, 8);
            buf.writeUInt32LE(length, 12);
            buf.writeUInt32LE((p.checksum ?? 0) >>> 0, 16);
            buf.writeUInt32LE((p.command ^ 0xffffffff) >>> 0, 20);
            buf.set(p.payload, HEADER);
            noteSent(p);
            wire.bytesWritten += buf.length;
            if (!socket.write(buf)) {
                await once(socket, "drain");
            }
        },
        close() {
            socket.end();
        },
        abort() {
            socket.destroy();
        },
    });
    return { readable, writable };
}

// --- credentials ----------------------------------------------------------------

class MemoryCredentialStore {
    #keys = [];
    generated = 0;
    async generateKey() {
        const { privateKey } = await webcrypto.subtle.generateKey(
            {
                name: "RSASSA-PKCS1-v1_5",
                modulusLength: 2048,
                publicExponent: new Uint8Array([0x01, 0x00, 0x01]),
                hash: "SHA-1",
            },
            true,
            ["sign", "verify"],
        );
        const buffer = new Uint8Array(await webcrypto.subtle.exportKey("pkcs8", privateKey));
        const key = { buffer, name: "oxadb-interop@tango" };
        this.#keys.push(key);
        this.generated++;
        return key;
    }
    *iterateKeys() {
        yield* this.#keys;
    }
}

// --- commands ---------------------------------------------------------------------

function takeOption(args, name) {
    const i = args.indexOf(name);
    if (i === -1) return undefined;
    const v = args[i + 1];
    if (v === undefined) throw new Error(`${name} needs a value`);
    args.splice(i, 2);
    return v;
}

function takeFlag(args, name) {
    const i = args.indexOf(name);
    if (i === -1) return false;
    args.splice(i, 1);
    return true;
}

async function collect(stream) {
    const chunks = [];
    for await (const c of stream) chunks.push(Buffer.from(c));
    return Buffer.concat(chunks);
}

function statJson(s) {
    return {
        mode: s.mode,
        type: s.type,
        permission: s.permission,
        size: Number(s.size),
        mtime: Number(s.mtime),
    };
}

const COMMANDS = {
    async features(adb, args, ctx) {
        if (args.length) throw new Error("features takes no arguments");
        const device = [...adb.banner.features];
        const host = [...adb.clientFeatures];
        return {
            product: adb.banner.product ?? null,
            model: adb.banner.model ?? null,
            device: adb.banner.device ?? null,
            device_features: device,
            host_features: host,
            max_payload: adb.maxPayloadSize,
            protocol_version: adb.transport.protocolVersion,
            // What Tango itself decides (AdbDaemonTransport: both banners
            // list delayed_ack and initialDelayedAckBytes > 0).
            delayed_ack: host.includes(AdbFeature.DelayedAck) && device.includes(AdbFeature.DelayedAck) && ctx.initialDelayedAckBytes > 0,
            can_use: Object.fromEntries(
                ["shell_v2", "stat_v2", "ls_v2", "sendrecv_v2", "delayed_ack", "fixed_push_mkdir"].map((f) => [f, adb.canUseFeature(f)]),
            ),
        };
    },

    async shell(adb, args) {
        const stdinB64 = takeOption(args, "--stdin-b64");
        const digest = takeFlag(args, "--digest");
        if (args.length !== 1) throw new Error("usage: shell CMD [--stdin-b64 DATA] [--digest]");
        if (!adb.subprocess.shellProtocol) throw new Error("device does not offer shell_v2");
        const proc = await adb.subprocess.shellProtocol.spawn([args[0]]);
        const writer = proc.stdin.getWriter();
        const feeding = (async () => {
            if (stdinB64 !== undefined) {
                const data = Buffer.from(stdinB64, "base64");
                if (data.length) await writer.write(new Uint8Array(data));
                // Tango >= 2.5.1 forwards this as the shell-v2 close-stdin frame.
                await writer.close();
            }
        })();
        const [stdout, stderr, exitCode] = await Promise.all([collect(proc.stdout), collect(proc.stderr), proc.exited]);
        await feeding;
        if (digest) {
            return {
                stdout_bytes: stdout.length,
                stdout_sha256: createHash("sha256").update(stdout).digest("hex"),
                stderr_b64: stderr.toString("base64"),
                exit_code: exitCode,
            };
        }
        return {
            stdout_b64: stdout.toString("base64"),
            stderr_b64: stderr.toString("base64"),
            exit_code: exitCode,
        };
    },

    async pty(adb, args) {
        const term = takeOption(args, "--term");
        const resize = takeOption(args, "--resize");
        const inputB64 = takeOption(args, "--input-b64");
        if (args.length !== 1) throw new Error("usage: pty CMD [--term T] [--resize ROWSxCOLS] [--input-b64 DATA]");
        if (!adb.subprocess.shellProtocol) throw new Error("device does not offer shell_v2");
        const proc = await adb.subprocess.shellProtocol.pty({ command: args[0], terminalType: term });
        // In order on the stream: the window size frame, then the input.
        if (resize !== undefined) {
            const [rows, cols] = resize.split("x").map(Number);
            await proc.resize(rows, cols);
        }
        if (inputB64 !== undefined) {
            const writer = proc.input.getWriter();
            await writer.write(new Uint8Array(Buffer.from(inputB64, "base64")));
            writer.releaseLock();
        }
        const [output, exitCode] = await Promise.all([collect(proc.output), proc.exited]);
        return { output_b64: output.toString("base64"), exit_code: exitCode };
    },

    async push(adb, args) {
        const mode = takeOption(args, "--mode");
        const mtime = takeOption(args, "--mtime");
        const dryRun = takeFlag(args, "--dry-run");
        if (args.length !== 2) throw new Error("usage: push LOCAL REMOTE [--mode OCTAL] [--mtime S] [--dry-run]");
        const [local, remote] = args;
        const hash = createHash("sha256");
        let bytes = 0;
        const source = Readable.toWeb(fs.createReadStream(local, { highWaterMark: 1 << 20 })).pipeThrough(
            new TransformStream({
                transform(chunk, controller) {
                    hash.update(chunk);
                    bytes += chunk.length;
                    controller.enqueue(new Uint8Array(chunk.buffer, chunk.byteOffset, chunk.length));
                },
            }),
        );
        const sync = await adb.sync();
        const started = performance.now();
        try {
            const options = { filename: remote, file: source };
            if (mode !== undefined) options.permission = parseInt(mode, 8);
            if (mtime !== undefined) options.mtime = Number(mtime);
            if (dryRun) options.dryRun = true;
            await sync.write(options);
        } finally {
            await sync.dispose();
        }
        const seconds = (performance.now() - started) / 1000;
        return {
            bytes,
            sha256: hash.digest("hex"),
            seconds,
            send_v2: sync.supportsSendReceiveV2,
        };
    },

    async pull(adb, args) {
        const stallMs = Number(takeOption(args, "--stall-ms") ?? 0);
        if (args.length !== 2) throw new Error("usage: pull REMOTE LOCAL [--stall-ms N]");
        const [remote, local] = args;
        const hash = createHash("sha256");
        let bytes = 0;
        const out = fs.createWriteStream(local);
        const sync = await adb.sync();
        const started = performance.now();
        try {
            let first = true;
            for await (const chunk of sync.read(remote)) {
                if (first && stallMs > 0) {
                    // A slow consumer: Tango stops acknowledging once its
                    // buffers are full, so the device must stop at its credit.
                    await new Promise((resolve) => setTimeout(resolve, stallMs));
                }
                first = false;
                const copy = Buffer.from(chunk);
                hash.update(copy);
                bytes += copy.length;
                if (!out.write(copy)) await once(out, "drain");
            }
        } finally {
            await sync.dispose();
            out.end();
            await once(out, "close");
        }
        const seconds = (performance.now() - started) / 1000;
        return { bytes, sha256: hash.digest("hex"), seconds };
    },

    async stat(adb, args) {
        if (args.length !== 1) throw new Error("usage: stat REMOTE");
        const sync = await adb.sync();
        try {
            const stat = statJson(await sync.stat(args[0]));
            const lstat = statJson(await sync.lstat(args[0]));
            return { stat, lstat };
        } finally {
            await sync.dispose();
        }
    },

    async ls(adb, args) {
        if (args.length !== 1) throw new Error("usage: ls REMOTE");
        const sync = await adb.sync();
        try {
            const entries = await sync.readdir(args[0]);
            return { entries: entries.map((e) => ({ name: e.name, ...statJson(e) })) };
        } finally {
            await sync.dispose();
        }
    },
};

// --- main -----------------------------------------------------------------------------

async function main() {
    const { opts, commands } = parseArgs(process.argv.slice(2));
    const timer = setTimeout(() => {
        process.stdout.write(JSON.stringify({ ok: false, error: `tango_client timed out after ${opts.timeout}s`, connection: wire }) + "\n");
        process.exit(2);
    }, opts.timeout * 1000);

    const socket = net.connect({ host: opts.host, port: opts.port });
    socket.setNoDelay(true);
    await once(socket, "connect");
    // The daemon logs this connection as `peer=127.0.0.1:<localPort>`.
    const localPort = socket.localPort;
    const connection = tcpConnection(socket);

    const credentialStore = new MemoryCredentialStore();
    const key = await credentialStore.generateKey();
    // Tango must be able to use the key (it would sign AUTH tokens with it).
    const publicKey = adbGeneratePublicKey(key.buffer);

    const features = opts.delayedAck
        ? [...ADB_DAEMON_DEFAULT_FEATURES]
        : ADB_DAEMON_DEFAULT_FEATURES.filter((f) => f !== AdbFeature.DelayedAck);
    // AOSP's adb host grants 32 MiB (Tango's default is the same).
    const initialDelayedAckBytes = opts.delayedAck ? 32 * 1024 * 1024 : 0;
    const transport = await AdbDaemonTransport.authenticate({
        serial: `${opts.host}:${opts.port}`,
        connection,
        credentialStore,
        features,
        initialDelayedAckBytes,
    });
    const adb = new Adb(transport);
    const ctx = { initialDelayedAckBytes };

    const run = async ([name, ...args]) => {
        const fn = COMMANDS[name];
        if (!fn) throw new Error(`unknown command ${name}`);
        const started = performance.now();
        const result = await fn(adb, args, ctx);
        return { command: name, ms: Math.round(performance.now() - started), ...result };
    };
    const results = [];
    if (opts.parallel) {
        results.push(...(await Promise.all(commands.map(run))));
    } else {
        for (const command of commands) results.push(await run(command));
    }
    await adb.close();
    socket.end();
    clearTimeout(timer);
    return {
        ok: true,
        local_port: localPort,
        results,
        credentials: { keys_generated: credentialStore.generated, public_key_bytes: publicKey.length },
        connection: wire,
    };
}

main().then(
    (out) => {
        process.stdout.write(JSON.stringify(out) + "\n");
        process.exit(0);
    },
    (e) => {
        process.stdout.write(
            JSON.stringify({ ok: false, error: String(e?.stack ?? e), connection: wire }) + "\n",
        );
        process.exit(1);
    },
);
