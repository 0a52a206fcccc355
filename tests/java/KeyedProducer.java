// Java's producer (kafka-clients), default partitioner: each key read from stdin (hex, one a
// line) is sent to the topic with the value ["java default", <its line number>], and its
// partition printed. Run as a single-file source program (tests/test_serving_partitioner.py):
//   java -cp <kafka-clients and slf4j-api jars> KeyedProducer.java BOOTSTRAP TOPIC < keys
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.Future;

import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class KeyedProducer {
    public static void main(String[] args) throws Exception {
        Properties settings = new Properties();
        settings.put("bootstrap.servers", args[0]);
        settings.put("linger.ms", "5");
        settings.put("max.request.size", String.valueOf(2 << 20));
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in,
                StandardCharsets.US_ASCII));
        List<Future<RecordMetadata>> sent = new ArrayList<>();
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(settings,
                new ByteArraySerializer(), new ByteArraySerializer())) {
            String line;
            int i = 0;
            while ((line = in.readLine()) != null) {
                byte[] key = HexFormat.of().parseHex(line.trim());
                byte[] value = ("[\"java default\", " + i++ + "]").getBytes(StandardCharsets.UTF_8);
                sent.add(producer.send(new ProducerRecord<>(args[1], key, value)));
            }
            producer.flush();
            for (int n = 0; n < sent.size(); n++) {
                System.out.println(n + " " + sent.get(n).get().partition());
            }
        }
    }
}
