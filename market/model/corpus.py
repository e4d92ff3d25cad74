"""The small English corpus the embedded tokenizer is trained on.

It is part of the source so the tokenizer (and with it every default modelId) depends only
on this text and the training code, never on a download. Editing it changes the tokenizer
bytes and therefore every embedded model's modelId.
"""

from __future__ import annotations

CORPUS = """\
The market opens early. Clients post batches of prompts, and miners compete to answer them.
Every answer is signed, every signature is checked, and every token is counted before payment.
A miner who cheats risks the stake it locked when it claimed the work.
The verifier reads the output again, token by token, and asks how likely each token was.
If the answer looks like the model wrote it, the score is high; if not, the score falls.

Once upon a time there was a small village at the edge of a great forest.
The people of the village grew wheat and barley, kept goats and chickens, and traded wool
with the town across the river. In the spring the river rose, and in the autumn it fell.
The children played by the water while their parents worked in the fields.
One day a stranger arrived with a cart full of books, and nothing was the same again.

Water boils at one hundred degrees Celsius at sea level. At higher altitudes the air pressure
is lower, so water boils at a lower temperature. This is why cooking pasta in the mountains
takes longer than cooking it by the sea. Salt raises the boiling point only a little.

The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a
single step. Actions speak louder than words. Knowledge is power, and time is money.
Practice makes perfect. Better late than never. Where there is a will, there is a way.

To make a cup of tea, boil fresh water, warm the pot, add one spoon of leaves for each cup,
pour the water over the leaves, and wait three to five minutes. Pour the tea through a
strainer. Add milk or lemon if you like, but never both at the same time.

Computers store numbers in binary. A bit is either zero or one; eight bits make a byte.
A program is a list of instructions that the processor follows one after another.
Memory holds the data the program is working on, and the disk keeps it when the power is off.
Networks connect computers so they can send messages to each other across the world.
A neural network is a function with many parameters, trained on examples to predict the next word.

What is the capital of France? The capital of France is Paris.
How many days are there in a week? There are seven days in a week.
Which planet is closest to the sun? Mercury is the planet closest to the sun.
Who wrote the play about the prince of Denmark? William Shakespeare wrote Hamlet.
Why is the sky blue? Sunlight is scattered by the air, and blue light is scattered the most.
Can you tell me a story? Of course. Here is a short story about a brave little mouse.
Please summarize the following text in one sentence. Translate this sentence into French.
Write a poem about the ocean. Explain the difference between weather and climate.

The weather today is cloudy with a chance of rain in the afternoon. Tomorrow will be sunny
and warm, with light winds from the south. Temperatures will rise through the week, and the
weekend should be dry. Farmers hope for rain next month, because the soil is getting dry.

In mathematics, a prime number is a number greater than one that has no divisors other than
one and itself. Two, three, five, seven, eleven and thirteen are prime numbers. The sum of
the angles of a triangle is one hundred and eighty degrees. Zero times any number is zero.

She opened the door and looked outside. The street was empty, and the lamps were still on.
He said that he would come back before dinner, but he never did. They waited for hours.
We walked along the beach and talked about the future. You should have seen the sunset.
It was the best of times, it was the worst of times. I think, therefore I am.

Good morning! How are you today? I am fine, thank you. What would you like to eat?
I would like some bread, some cheese, and a glass of water, please. That will be four dollars.
Thank you very much. You are welcome. Have a nice day. See you later.

History is the study of the past. Historians read old letters, records and books, and they
ask what happened, when it happened, and why. Some questions have clear answers; others
are still argued about today. The first cities were built near rivers, where the land was
rich and water was easy to find. Writing was invented to keep track of grain and taxes.

The engine turns the fuel into motion. The wheels turn, the car moves, and the road passes
below. A good driver watches the road, keeps a safe distance, and slows down in the rain.
Trains carry people and goods between cities; ships cross the oceans; planes fly above the
clouds. Every journey needs a plan, a map, and a little bit of luck.

Music is made of sound and silence. A melody is a sequence of notes; harmony is notes played
together; rhythm is the pattern of time. People have made music in every culture and in every
age, with drums, strings, flutes and voices. Some songs are happy, and some are sad.

Doctors say that sleep, exercise and a balanced diet keep the body healthy. Drink enough water,
eat fruit and vegetables, walk every day, and go to bed at a regular time. Wash your hands
before you eat. If you feel ill for more than a few days, visit a doctor.

The library was quiet. Rows of shelves stretched from the floor to the ceiling, and the smell
of old paper filled the air. A student sat at a long table, reading about stars and galaxies.
The universe is very large and very old, and most of it is empty space. Light from the
nearest star other than the sun takes more than four years to reach us.

Numbers: 0 1 2 3 4 5 6 7 8 9 10 12 16 20 32 42 64 100 128 256 512 1000 1024 2024 2025.
Symbols: + - * / = < > ( ) [ ] { } # @ & % $ ! ? : ; , . ' " _ ~ ^ | \\ `
def add(a, b):
    return a + b

for i in range(10):
    print(i, i * i)

{"model": "tiny", "prompt": "Hello", "max_tokens": 16, "temperature": 0.7, "top_p": 0.9}
"""
