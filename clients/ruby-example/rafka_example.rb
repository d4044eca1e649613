#!/usr/bin/env ruby
# frozen_string_literal: true

# A Ruby program that talks to rafka with plain redis-rb (Debian's ruby-redis, 4.x),
# sending exactly what rafka-rb 0.5.0 sends (see the Rafka spec, section 12):
#   producer: RPUSHX topics:<topic>[:<key>] <msg>, DUMP <ms>, no SETNAME;
#   consumer: CLIENT SETNAME <group>:<id> on every (re)connect (redis-rb's `id` option),
#             BLPOP topics:<topic>[:<json>] <timeout>, RPUSH acks <topic>:<partition>:<offset>.
#
# Usage:
#   rafka_example.rb produce PORT TOPIC COUNT [KEY]     -> prints {"flushed": n}
#   rafka_example.rb consume PORT TOPIC GROUP COUNT     -> prints one JSON line per record
#   rafka_example.rb stats PORT                         -> prints the stats hash as JSON
#
# Environment: RAFKA_TLS_CA_FILE connects with TLS (redis-rb's `ssl: true`), trusting that
# CA; RAFKA_TLS_CERT_FILE and RAFKA_TLS_KEY_FILE add a client certificate (mTLS);
# RAFKA_USERNAME and RAFKA_PASSWORD authenticate (AUTH user pass).

require "json"
require "openssl"
require "redis"

module RafkaExample
  class Error < StandardError; end
  class ProduceError < Error; end
  class ConsumeError < Error; end

  # rafka-rb maps "PROD "/"CONS " prefixed errors to its own exception classes.
  def self.wrap_errors
    yield
  rescue Redis::CommandError => e
    raise ProduceError, e.message[5..] if e.message.start_with?("PROD ")
    raise ConsumeError, e.message[5..] if e.message.start_with?("CONS ")

    raise
  end

  # TLS and credentials from the environment (see the top of this file).
  def self.connection_options
    options = {}
    options[:username] = ENV["RAFKA_USERNAME"] if ENV["RAFKA_USERNAME"]
    options[:password] = ENV["RAFKA_PASSWORD"] if ENV["RAFKA_PASSWORD"]
    return options unless ENV["RAFKA_TLS_CA_FILE"]

    params = { ca_file: ENV["RAFKA_TLS_CA_FILE"] }
    if ENV["RAFKA_TLS_CERT_FILE"]
      params[:cert] = OpenSSL::X509::Certificate.new(File.read(ENV["RAFKA_TLS_CERT_FILE"]))
      params[:key] = OpenSSL::PKey.read(File.read(ENV["RAFKA_TLS_KEY_FILE"]))
    end
    options.merge(ssl: true, ssl_params: params)
  end

  class Producer
    # No reconnects: DUMP answers for the records sent on its own connection, so a DUMP
    # re-sent on a new one (redis-rb's reconnect) would answer 0 for records that went
    # with the old one. A lost connection raises; produce the batch again. The read
    # timeout outlasts the DUMP's own.
    def initialize(port, flush_timeout_ms: 5000)
      @redis = Redis.new(host: "127.0.0.1", port: port, reconnect_attempts: 0,
                         read_timeout: flush_timeout_ms / 1000.0 + 5,
                         **RafkaExample.connection_options)
    end

    def produce(topic, msg, key: nil)
      dest = key ? "topics:#{topic}:#{key}" : "topics:#{topic}"
      RafkaExample.wrap_errors { @redis.rpushx(dest, msg.to_s) }
    end

    def flush(timeout_ms = 5000)
      RafkaExample.wrap_errors { Integer(@redis.dump(timeout_ms.to_s)) }
    end

    def stats
      @redis.hgetall("stats")
    end

    def close
      @redis.quit
    end
  end

  Message = Struct.new(:topic, :partition, :offset, :value)

  class Consumer
    def initialize(port, topic:, group:, id:, librdkafka: {})
      @topic = topic
      @redis = Redis.new(host: "127.0.0.1", port: port, id: "#{group}:#{id}", reconnect_attempts: 5,
                         **RafkaExample.connection_options)
      @blpop_arg = librdkafka.empty? ? "topics:#{topic}" : "topics:#{topic}:#{librdkafka.to_json}"
    end

    def consume(timeout = 5)
      reply = RafkaExample.wrap_errors { @redis.blpop(@blpop_arg, timeout: timeout) }
      return nil if reply.nil?
      raise Error, "malformed message: #{reply.inspect}" unless reply.is_a?(Array) && reply.size == 8

      msg = Message.new(reply[1], Integer(reply[3]), Integer(reply[5]), reply[7])
      commit(msg)
      msg
    end

    # One ack per topic-partition, carrying the highest offset, as rafka-rb does.
    def commit(*msgs)
      highest = Hash.new { |h, k| h[k] = {} }
      msgs.each do |m|
        current = highest[m.topic][m.partition]
        highest[m.topic][m.partition] = m.offset if current.nil? || m.offset > current
      end
      highest.each do |topic, partitions|
        partitions.each do |partition, offset|
          RafkaExample.wrap_errors { @redis.rpush("acks", "#{topic}:#{partition}:#{offset}") }
        end
      end
      highest
    end

    def close
      @redis.quit
    end
  end
end

def main(argv)
  command = argv.shift
  case command
  when "produce"
    port, topic, count, key = argv
    producer = RafkaExample::Producer.new(Integer(port))
    begin
      Integer(count).times { |i| producer.produce(topic, i.to_s, key: key) }
      puts({ flushed: producer.flush(5000) }.to_json)
    rescue Redis::BaseConnectionError => e
      warn "rafka_example: connection lost (#{e.message}): the records may not be stored"
      exit 1
    end
    producer.close
  when "consume"
    port, topic, group, count = argv
    consumer = RafkaExample::Consumer.new(Integer(port), topic: topic, group: group, id: "ruby-#{Process.pid}")
    received = 0
    deadline = Time.now + 30
    while received < Integer(count) && Time.now < deadline
      msg = consumer.consume(1)
      next if msg.nil?

      puts({ topic: msg.topic, partition: msg.partition, offset: msg.offset, value: msg.value }.to_json)
      received += 1
    end
    consumer.close
  when "stats"
    producer = RafkaExample::Producer.new(Integer(argv[0]))
    puts producer.stats.to_json
    producer.close
  else
    warn "usage: rafka_example.rb produce|consume|stats ..."
    return 2
  end
  0
rescue RafkaExample::Error => e
  warn "#{e.class}: #{e.message}"
  1
end

exit(main(ARGV.dup)) if $PROGRAM_NAME == __FILE__
