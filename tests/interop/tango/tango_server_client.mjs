// Tango's adb server client (@yume-chan/adb's AdbServerClient over
// @yume-chan/adb-server-node-tcp) against an adb host server, for
// tests/interop/test_server_clients.py: the way web and Electron tools built
// on Tango use `adb server` instead of talking to devices themselves.
//
//   node tango_server_client.mjs --port PORT [--timeout SECONDS] COMMAND ARGS...
//
// Commands (one per run):
//   devices                        AdbServerClient.getDevices (host:devices-l)
//   track                          AdbServerClient.trackDevices: one JSON line
//                                  per list change, until stdin closes
//   shell SERIAL CMD               shell protocol v2: stdout, stderr, exit code
//   push SERIAL LOCAL REMOTE       AdbSync.write; the bytes sent and their sha256
//   pull SERIAL REMOTE LOCAL       AdbSync.read into LOCAL; bytes and sha256
//   socket SERIAL SERVICE SIZE     Adb.createSocket(SERVICE) (e.g. tcp:PORT, a
//                                  forward's device end): SIZE random bytes
//                                  sent, the echo read back, compared
//   reverse SERIAL DEVICE HOST     AdbReverseService.addExternal(DEVICE, HOST),
//                                  then list
//   reverse-remove SERIAL DEVICE   AdbReverseService.remove, then list
//
// Output (but for track): one JSON document, {"ok": true, "result": ...} or
// {"ok": false, "error": "..."} with exit status 1.

import { createHash, randomBytes } from "node:crypto";
import { once } from "node:events";
import fs from "node:fs";
import { Readable } from "node:stream";

import { AdbServerClient } from "@yume-chan/adb";
import { AdbServerNodeTcpConnector } from "@yume-chan/adb-server-node-tcp";

function parseArgs(argv) {
    const opts = { port: 0, timeout: 90, command: null, args: [] };
    const rest = [];
    for (let i = 0; i < argv.length; i++) {
        if (argv[i] === "--port") opts.port = Number(argv[++i]);
        else if (argv[i] === "--timeout") opts.timeout = Number(argv[++i]);
        else rest.push(argv[i]);
    }
    if (!opts.port) throw new Error("--port is required");
    [opts.command, ...opts.args] = rest;
    return opts;
}

function deviceJson(d) {
    return { serial: d.serial, state: d.state, transport_id: String(d.transportId) };
}

async function collect(readable) {
    const chunks = [];
    for await (const chunk of readable) chunks.push(Buffer.from(chunk));
    return Buffer.concat(chunks);
}

async function withAdb(client, serial, body) {
    const adb = await client.createAdb({ serial });
    try {
        return await body(adb);
    } finally {
        await adb.close();
    }
}

const COMMANDS = {
    async devices(client) {
        return (await client.getDevices(["device", "unauthorized", "offline"])).map(deviceJson);
    },

    async track(client) {
        const observer = await client.trackDevices({ includeStates: ["device", "unauthorized", "offline"] });
        const print = (list) => process.stdout.write(JSON.stringify(list.map(deviceJson)) + "\n");
        print(observer.current);
        observer.onListChange(print);
        let failed = null;
        observer.onError((e) => {
            failed = e;
            process.stdin.destroy();
        });
        process.stdin.resume();
        await once(process.stdin, "close");
        await observer.stop();
        if (failed) throw failed;
        return null;
    },

    async shell(client, [serial, command]) {
        return withAdb(client, serial, async (adb) => {
            if (!adb.subprocess.shellProtocol) throw new Error("no shell_v2 through the server");
            const proc = await adb.subprocess.shellProtocol.spawn([command]);
            const [stdout, stderr, exitCode] = await Promise.all([collect(proc.stdout), collect(proc.stderr), proc.exited]);
            return { stdout: stdout.toString(), stderr: stderr.toString(), exit_code: exitCode };
        });
    },

    async push(client, [serial, local, remote]) {
        const hash = createHash("sha256");
        let bytes = 0;
        const file = Readable.toWeb(fs.createReadStream(local, { highWaterMark: 1 << 20 })).pipeThrough(
            new TransformStream({
                transform(chunk, controller) {
                    hash.update(chunk);
                    bytes += chunk.length;
                    controller.enqueue(new Uint8Array(chunk.buffer, chunk.byteOffset, chunk.length));
                },
            }),
        );
        return withAdb(client, serial, async (adb) => {
            const sync = await adb.sync();
            try {
                await sync.write({ filename: remote, file });
            } finally {
                await sync.dispose();
            }
            return { bytes, sha256: hash.digest("hex") };
        });
    },

    async pull(client, [serial, remote, local]) {
        return withAdb(client, serial, async (adb) => {
            const hash = createHash("sha256");
            let bytes = 0;
            const out = fs.createWriteStream(local);
            const sync = await adb.sync();
            try {
                for await (const chunk of sync.read(remote)) {
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
            return { bytes, sha256: hash.digest("hex") };
        });
    },

    async socket(client, [serial, service, size]) {
        return withAdb(client, serial, async (adb) => {
            const sent = randomBytes(Number(size));
            const socket = await adb.createSocket(service);
            const reading = (async () => {
                const chunks = [];
                let got = 0;
                const reader = socket.readable.getReader();
                while (got < sent.length) {
                    const { value, done } = await reader.read();
                    if (done) break;
                    chunks.push(Buffer.from(value));
                    got += value.length;
                }
                reader.releaseLock();
                return Buffer.concat(chunks);
            })();
            const writer = socket.writable.getWriter();
            for (let at = 0; at < sent.length; at += 64 * 1024) {
                await writer.write(new Uint8Array(sent.subarray(at, at + 64 * 1024)));
            }
            writer.releaseLock();
            const back = await reading;
            await socket.close();
            return { sent: sent.length, echoed: back.length, equal: back.equals(sent) };
        });
    },

    async reverse(client, [serial, device, host]) {
        return withAdb(client, serial, async (adb) => {
            const bound = await adb.reverse.addExternal(device, host);
            return { bound, list: await adb.reverse.list() };
        });
    },

    async "reverse-remove"(client, [serial, device]) {
        return withAdb(client, serial, async (adb) => {
            await adb.reverse.remove(device);
            return { list: await adb.reverse.list() };
        });
    },
};

async function main() {
    const opts = parseArgs(process.argv.slice(2));
    const command = COMMANDS[opts.command];
    if (!command) throw new Error(`unknown command ${opts.command}`);
    const timer = setTimeout(() => {
        process.stdout.write(JSON.stringify({ ok: false, error: `timed out after ${opts.timeout}s` }) + "\n");
        process.exit(1);
    }, opts.timeout * 1000);
    const client = new AdbServerClient(new AdbServerNodeTcpConnector({ host: "127.0.0.1", port: opts.port }));
    const result = await command(client, opts.args);
    clearTimeout(timer);
    if (opts.command !== "track") process.stdout.write(JSON.stringify({ ok: true, result }) + "\n");
}

main().then(
    () => process.exit(0),
    (e) => {
        process.stdout.write(JSON.stringify({ ok: false, error: String(e?.stack ?? e) }) + "\n");
        process.exit(1);
    },
);
