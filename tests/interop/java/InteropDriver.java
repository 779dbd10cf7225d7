// A Java BookKeeper client driven by the interop tests: one JSON request a line on stdin, one JSON
// answer a line on stdout, each tagged with the request's "id". Requests run concurrently (a long
// poll can wait while adds go on), on Apache BookKeeper's own client classes:
// org.apache.bookkeeper.client.BookKeeper / LedgerHandle (the classic API) and the
// org.apache.bookkeeper.client.api builders for long polls.
//
// Entry i written with a "prefix" P holds the UTF-8 bytes of "P:i"; answers carry entries in base64.
// A request that fails answers {"id", "error": <exception class>, "code": <BKException code or 0>,
// "message"}. The driver ends when stdin closes.

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.Base64;
import java.util.Enumeration;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import org.apache.bookkeeper.client.BKException;
import org.apache.bookkeeper.client.BookKeeper;
import org.apache.bookkeeper.client.LedgerEntry;
import org.apache.bookkeeper.client.LedgerHandle;
import org.apache.bookkeeper.client.api.LastConfirmedAndEntry;
import org.apache.bookkeeper.client.api.ReadHandle;
import org.apache.bookkeeper.conf.ClientConfiguration;

public class InteropDriver {
    private static final ObjectMapper JSON = new ObjectMapper();
    private static final PrintStream OUT = new PrintStream(System.out, true, StandardCharsets.UTF_8);
    private static final Map<String, BookKeeper> CLIENTS = new ConcurrentHashMap<>();
    private static final Map<String, LedgerHandle> HANDLES = new ConcurrentHashMap<>();

    public static void main(String[] args) throws Exception {
        ExecutorService pool = Executors.newCachedThreadPool();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        answer(JSON.createObjectNode().put("id", 0).put("ready", true));
        String line;
        while ((line = in.readLine()) != null) {
            if (line.isBlank()) {
                continue;
            }
            JsonNode request = JSON.readTree(line);
            pool.submit(() -> run(request));
        }
        pool.shutdown();
        pool.awaitTermination(30, TimeUnit.SECONDS);
        for (LedgerHandle handle : HANDLES.values()) {
            try {
                handle.close();
            } catch (Exception ignored) {
                // a fenced or failed handle: nothing more to do with it
            }
        }
        for (BookKeeper client : CLIENTS.values()) {
            client.close();
        }
        System.exit(0);
    }

    private static void run(JsonNode request) {
        ObjectNode answer = JSON.createObjectNode();
        answer.put("id", request.get("id").asLong());
        try {
            perform(request, answer);
        } catch (Throwable error) {
            Throwable cause = error;
            while (!(cause instanceof BKException) && cause.getCause() != null) {
                cause = cause.getCause();
            }
            answer.put("error", cause.getClass().getSimpleName());
            answer.put("code", cause instanceof BKException ? ((BKException) cause).getCode() : 0);
            answer.put("message", String.valueOf(cause.getMessage()));
        }
        answer(answer);
    }

    private static synchronized void answer(ObjectNode answer) {
        OUT.println(answer.toString());
    }

    private static void perform(JsonNode request, ObjectNode answer) throws Exception {
        switch (request.get("op").asText()) {
            case "create": {
                LedgerHandle handle = client(request).createLedger(
                        request.get("ensemble").asInt(), request.get("writeQuorum").asInt(),
                        request.get("ackQuorum").asInt(), digest(request), password(request));
                HANDLES.put(request.get("handle").asText(), handle);
                answer.put("ledgerId", handle.getId());
                break;
            }
            case "open": {
                BookKeeper client = client(request);
                long ledgerId = request.get("ledgerId").asLong();
                LedgerHandle handle = request.path("recovery").asBoolean(true)
                        ? client.openLedger(ledgerId, digest(request), password(request))
                        : client.openLedgerNoRecovery(ledgerId, digest(request), password(request));
                HANDLES.put(request.get("handle").asText(), handle);
                describe(handle, answer);
                break;
            }
            case "add": {
                LedgerHandle handle = handle(request);
                String prefix = request.get("prefix").asText();
                long first = request.path("first").asLong(0);
                long count = request.get("count").asLong();
                long pauseMs = request.path("pauseMs").asLong(0);
                long last = -1;
                for (long i = first; i < first + count; i++) {
                    last = handle.addEntry((prefix + ":" + i).getBytes(StandardCharsets.UTF_8));
                    if (pauseMs > 0) {
                        Thread.sleep(pauseMs);
                    }
                }
                answer.put("lastEntryId", last);
                break;
            }
            case "read": {
                LedgerHandle handle = handle(request);
                Enumeration<LedgerEntry> entries = handle.readEntries(
                        request.get("first").asLong(), request.get("last").asLong());
                ArrayNode list = answer.putArray("entries");
                while (entries.hasMoreElements()) {
                    LedgerEntry entry = entries.nextElement();
                    list.addObject().put("entryId", entry.getEntryId())
                            .put("data", Base64.getEncoder().encodeToString(entry.getEntry()));
                }
                break;
            }
            case "readLastConfirmed":
                answer.put("lac", handle(request).readLastConfirmed());
                break;
            case "readExplicitLastConfirmed":
                answer.put("lac", handle(request).readExplicitLastConfirmed());
                break;
            case "describe":
                describe(handle(request), answer);
                break;
            case "close":
                handle(request).close();
                describe(handle(request), answer);
                break;
            case "tail": {
                // Follows a ledger with long polls, as a tailing reader on Java's new API does:
                // readLastAddConfirmedAndEntry(next) until "count" entries came, counting calls.
                ReadHandle reader = client(request).newOpenLedgerOp()
                        .withLedgerId(request.get("ledgerId").asLong()).withRecovery(false)
                        .withPassword(password(request))
                        .withDigestType(org.apache.bookkeeper.client.api.DigestType.valueOf(
                                request.get("digest").asText()))
                        .execute().get();
                long count = request.get("count").asLong();
                long timeoutMs = request.path("timeoutMs").asLong(10000);
                long maxCalls = 3 * count + 10;
                long next = 0;
                long calls = 0;
                ArrayNode list = answer.putArray("entries");
                while (next < count && calls < maxCalls) {
                    calls++;
                    try (LastConfirmedAndEntry got =
                            reader.readLastAddConfirmedAndEntry(next, timeoutMs, false)) {
                        if (got.hasEntry()) {
                            list.addObject().put("entryId", got.getEntry().getEntryId()).put("data",
                                    Base64.getEncoder().encodeToString(got.getEntry().getEntryBytes()));
                            next++;
                        }
                    }
                }
                reader.close();
                answer.put("calls", calls);
                break;
            }
            default:
                throw new IllegalArgumentException("unknown op " + request.get("op").asText());
        }
    }

    private static void describe(LedgerHandle handle, ObjectNode answer) {
        answer.put("ledgerId", handle.getId());
        answer.put("lac", handle.getLastAddConfirmed());
        answer.put("length", handle.getLength());
        answer.put("closed", handle.isClosed());
    }

    private static LedgerHandle handle(JsonNode request) {
        LedgerHandle handle = HANDLES.get(request.get("handle").asText());
        if (handle == null) {
            throw new IllegalArgumentException("no handle " + request.get("handle").asText());
        }
        return handle;
    }

    private static BookKeeper client(JsonNode request) throws Exception {
        String uri = request.get("uri").asText();
        boolean v3 = request.path("v3").asBoolean(true);
        long explicitLacMs = request.path("explicitLacMs").asLong(0);
        String key = uri + "|" + v3 + "|" + explicitLacMs;
        BookKeeper client = CLIENTS.get(key);
        if (client == null) {
            synchronized (CLIENTS) {
                client = CLIENTS.get(key);
                if (client == null) {
                    ClientConfiguration conf = new ClientConfiguration();
                    conf.setMetadataServiceUri(uri);
                    conf.setUseV2WireProtocol(!v3);
                    conf.setExplictLacInterval((int) explicitLacMs); // sic: Java's setter name
                    conf.setAddEntryTimeout(10);
                    conf.setReadEntryTimeout(10);
                    client = new BookKeeper(conf);
                    CLIENTS.put(key, client);
                }
            }
        }
        return client;
    }

    private static BookKeeper.DigestType digest(JsonNode request) {
        return BookKeeper.DigestType.valueOf(request.get("digest").asText());
    }

    private static byte[] password(JsonNode request) {
        return request.get("password").asText().getBytes(StandardCharsets.UTF_8);
    }
}
